"""Channel mute states: why a connection is not being read, as Kafka's KafkaChannel has them.

A channel is muted while one of its requests is being served (so responses leave in request
order) and while it is throttled (KIP-219).  The two reasons combine; reading resumes only once
both are over, in either order.  Memory-pressure muting (KIP-72) is a separate flag on the
connection, never undone by these transitions.

Legal transitions (state, event -> state):

    NOT_MUTED        --mute-->               MUTED
    MUTED            --unmute-->             NOT_MUTED
    MUTED            --REQUEST_RECEIVED-->   RESPONSE_PENDING
    RESPONSE_PENDING --RESPONSE_SENT-->      MUTED
    RESPONSE_PENDING --THROTTLE_STARTED-->   THROTTLED_RESPONSE_PENDING
    THROTTLED_RESPONSE_PENDING --RESPONSE_SENT-->  THROTTLED
    THROTTLED_RESPONSE_PENDING --THROTTLE_ENDED--> RESPONSE_PENDING
    THROTTLED        --THROTTLE_ENDED-->     MUTED

Anything else raises IllegalMuteTransition; the connection then closes with a log line.
"""

from __future__ import annotations

import enum


class MuteState(enum.IntEnum):
    NOT_MUTED = 0
    MUTED = 1
    RESPONSE_PENDING = 2  # Kafka's MUTED_AND_RESPONSE_PENDING
    THROTTLED = 3  # MUTED_AND_THROTTLED
    THROTTLED_RESPONSE_PENDING = 4  # MUTED_AND_THROTTLED_AND_RESPONSE_PENDING


class MuteEvent(enum.IntEnum):
    REQUEST_RECEIVED = 0
    RESPONSE_SENT = 1
    THROTTLE_STARTED = 2
    THROTTLE_ENDED = 3


class IllegalMuteTransition(RuntimeError):
    """An event that cannot happen in the channel's current state."""


_TRANSITIONS = {
    (MuteState.MUTED, MuteEvent.REQUEST_RECEIVED): MuteState.RESPONSE_PENDING,
    (MuteState.RESPONSE_PENDING, MuteEvent.RESPONSE_SENT): MuteState.MUTED,
    (MuteState.RESPONSE_PENDING, MuteEvent.THROTTLE_STARTED): MuteState.THROTTLED_RESPONSE_PENDING,
    (MuteState.THROTTLED_RESPONSE_PENDING, MuteEvent.RESPONSE_SENT): MuteState.THROTTLED,
    (MuteState.THROTTLED_RESPONSE_PENDING, MuteEvent.THROTTLE_ENDED): MuteState.RESPONSE_PENDING,
    (MuteState.THROTTLED, MuteEvent.THROTTLE_ENDED): MuteState.MUTED,
}


def transition(state: MuteState, event: MuteEvent) -> MuteState:
    """The state after `event`, or IllegalMuteTransition."""
    try:
        return _TRANSITIONS[state, event]
    except KeyError:
        raise IllegalMuteTransition(f"cannot transition from {state.name} for {event.name}") from None


def _composite(*steps) -> dict[MuteState, MuteState]:
    """Precompute a fixed sequence of mute/unmute/events for every state where it is legal."""
    table = {}
    for state in MuteState:
        try:
            result = state
            for step in steps:
                result = step(result) if callable(step) else transition(result, step)
        except IllegalMuteTransition:
            continue
        table[state] = result
    return table


def mute(state: MuteState) -> MuteState:
    """Muting is idempotent from NOT_MUTED or MUTED; a muted channel with work pending stays."""
    return MuteState.MUTED if state is MuteState.NOT_MUTED else state


def unmute(state: MuteState) -> MuteState:
    """Only a plain MUTED channel can be unmuted; pending responses or throttles keep it muted."""
    return MuteState.NOT_MUTED if state is MuteState.MUTED else state


# The per-request pair, precomputed because it runs for every request served:
#   RECEIVED = mute, then REQUEST_RECEIVED;  SENT = RESPONSE_SENT, then unmute.
# Both map a state to the next; a state missing from the table is an illegal transition.
RECEIVED = _composite(mute, MuteEvent.REQUEST_RECEIVED)
SENT = _composite(MuteEvent.RESPONSE_SENT, unmute)


def request_received(state: MuteState) -> MuteState:
    """Mute the channel and note its request in flight (only a NOT_MUTED/MUTED channel reads)."""
    try:
        return RECEIVED[state]
    except KeyError:
        raise IllegalMuteTransition(f"cannot receive a request in state {state.name}") from None


def response_sent(state: MuteState) -> MuteState:
    """The response left: RESPONSE_SENT, then unmute unless a throttle still holds."""
    try:
        return SENT[state]
    except KeyError:
        raise IllegalMuteTransition(f"cannot send a response in state {state.name}") from None
