"""The channel mute state machine (Kafka's KafkaChannel ChannelMuteState)."""

import itertools

import pytest

from workers.mute import (IllegalMuteTransition, MuteEvent, MuteState, mute, request_received,
                          response_sent, transition, unmute)

S, E = MuteState, MuteEvent
LEGAL = {
    (S.MUTED, E.REQUEST_RECEIVED): S.RESPONSE_PENDING,
    (S.RESPONSE_PENDING, E.RESPONSE_SENT): S.MUTED,
    (S.RESPONSE_PENDING, E.THROTTLE_STARTED): S.THROTTLED_RESPONSE_PENDING,
    (S.THROTTLED_RESPONSE_PENDING, E.RESPONSE_SENT): S.THROTTLED,
    (S.THROTTLED_RESPONSE_PENDING, E.THROTTLE_ENDED): S.RESPONSE_PENDING,
    (S.THROTTLED, E.THROTTLE_ENDED): S.MUTED,
}


@pytest.mark.parametrize("state, event", list(itertools.product(MuteState, MuteEvent)))
def test_every_pair_is_legal_or_raises(state, event):
    if (state, event) in LEGAL:
        assert transition(state, event) is LEGAL[state, event]
    else:
        with pytest.raises(IllegalMuteTransition, match=f"from {state.name} for {event.name}"):
            transition(state, event)


def test_mute_and_unmute():
    assert mute(S.NOT_MUTED) is S.MUTED
    assert unmute(S.MUTED) is S.NOT_MUTED
    for busy in (S.RESPONSE_PENDING, S.THROTTLED, S.THROTTLED_RESPONSE_PENDING):
        assert mute(busy) is busy and unmute(busy) is busy


@pytest.mark.parametrize("throttle_ends_first", [True, False])
def test_throttle_and_response_end_in_either_order(throttle_ends_first):
    state = request_received(S.NOT_MUTED)
    state = transition(state, E.THROTTLE_STARTED)
    if throttle_ends_first:
        state = transition(state, E.THROTTLE_ENDED)
        assert unmute(state) is S.RESPONSE_PENDING  # the response still holds the channel
        state = response_sent(state)
    else:
        state = transition(state, E.RESPONSE_SENT)
        assert unmute(state) is S.THROTTLED  # the throttle still holds it
        state = unmute(transition(state, E.THROTTLE_ENDED))
    assert state is S.NOT_MUTED


def test_per_request_shortcuts_match_the_machine():
    assert request_received(S.NOT_MUTED) is S.RESPONSE_PENDING
    assert response_sent(S.RESPONSE_PENDING) is S.NOT_MUTED
    assert response_sent(S.THROTTLED_RESPONSE_PENDING) is S.THROTTLED
    with pytest.raises(IllegalMuteTransition):
        request_received(S.RESPONSE_PENDING)  # a second request while one is in flight
    with pytest.raises(IllegalMuteTransition):
        response_sent(S.NOT_MUTED)
