"""The group coordinator's state machine, in process: requests in, answers out, real timers.

Requests are encoded with kio, handed to `GroupCoordinator.handle` as a worker would forward
them, and answers decoded with kio; waiting answers are Futures on a real event loop.
"""

import pytest
from kio.schema.errors import ErrorCode

from broker.parent.groups.offsets import OffsetStore
from broker.shared.clock import now_ms
from broker.shared.config import load_config
from tests.groups.helpers import GroupHarness


@pytest.fixture
def harness(tmp_path):
    found = GroupHarness(tmp_path)
    yield found
    found.close()


def codes(answer) -> list[int]:
    return [p.error_code for t in answer.topics for p in t.partitions]


def test_join_needs_a_member_id_then_forms_a_generation_with_a_leader(harness):
    member, join = harness.join_member()
    joined = harness.wait(join)
    assert (joined.error_code, joined.generation_id, joined.leader) == (ErrorCode.none, 1, member)
    assert joined.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in joined.members] == [(member, b"m")]
    synced = harness.wait(harness.sync(member, 1, [(member, b"all of it")]))
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"all of it")
    assert harness.heartbeat(member, 1) == ErrorCode.none
    assert harness.heartbeat(member, 0) == ErrorCode.illegal_generation
    assert harness.heartbeat("stranger", 1) == ErrorCode.unknown_member_id
    assert harness.join(member_id="never-issued").error_code == ErrorCode.unknown_member_id
    assert harness.join(session=0.01).error_code == ErrorCode.invalid_session_timeout
    assert harness.join(protocols=()).error_code == ErrorCode.inconsistent_group_protocol


def test_a_second_member_rebalances_and_only_the_leader_assigns(harness):
    first, join = harness.join_member()
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"p0,p1")]))
    second, join_second = harness.join_member(client_id="other")
    assert harness.heartbeat(first, 1) == ErrorCode.rebalance_in_progress  # told to rejoin
    assert not join_second.done()
    rejoin = harness.join(member_id=first)
    leader_view, follower_view = harness.wait(rejoin), harness.wait(join_second)
    assert leader_view.generation_id == follower_view.generation_id == 2
    assert leader_view.leader == follower_view.leader == first
    assert sorted(m.member_id for m in leader_view.members) == sorted([first, second])
    assert list(follower_view.members) == []
    waiting = harness.sync(second, 2)
    harness.settle(0.05)
    assert not waiting.done()  # the follower waits for the leader's assignment
    led = harness.wait(harness.sync(first, 2, [(first, b"p0"), (second, b"p1")]))
    assert led.assignment == b"p0" and harness.wait(waiting).assignment == b"p1"
    described = harness.send(15, 5, {"groups": ["g", "nobody"],
                                     "include_authorized_operations": False})
    group, missing = described.groups
    assert (group.group_state, group.protocol_data, len(group.members)) == \
        ("Stable", "range", 2)
    assert {m.client_id for m in group.members} == {"test", "other"}
    assert {m.client_host for m in group.members} == {"/10.1.2.3"}  # Java's InetAddress form
    assert missing.group_state == "Dead"


def test_an_expired_session_or_a_leave_rebalances_the_rest(harness):
    first, join = harness.join_member(session=2.0)
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"x")]))
    second, join_second = harness.join_member(session=1.0)
    harness.wait(harness.join(member_id=first, session=2.0))
    harness.wait(join_second)
    harness.wait(harness.sync(first, 2, [(first, b"a"), (second, b"b")]))
    harness.settle(0.5)  # wide margins: a loaded CI machine pauses
    assert harness.heartbeat(first, 2) == ErrorCode.none  # the second member goes silent
    # The second: 1.4 s silent (expiry is checked every 0.25 s); the first: 0.9 of its 2 s.
    harness.settle(0.9)
    assert harness.heartbeat(first, 2) == ErrorCode.rebalance_in_progress
    alone = harness.wait(harness.join(member_id=first, session=0.3))
    assert (alone.generation_id, [m.member_id for m in alone.members]) == (3, [first])
    left = harness.send(13, 3, {"group_id": "g", "members": [
        {"member_id": first, "group_instance_id": None}]})
    assert [m.error_code for m in left.members] == [ErrorCode.none]
    harness.settle(0.05)
    listed = harness.send(16, 4, {"states_filter": []})
    assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Empty")]


def test_a_member_that_does_not_rejoin_is_dropped_after_the_rebalance_timeout(harness):
    first, join = harness.join_member(rebalance=0.3)
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"x")]))
    second, join_second = harness.join_member(rebalance=0.3)  # the first never rejoins
    answer = harness.wait(join_second, timeout=3)
    assert (answer.generation_id, answer.leader) == (2, second)
    assert [m.member_id for m in answer.members] == [second]


def test_static_member_rejoining_keeps_its_assignment_without_a_rebalance(harness):
    joined = harness.wait(harness.join(instance="host-1"))
    member = joined.member_id
    harness.wait(harness.sync(member, 1, [(member, b"mine")]))
    again = harness.wait(harness.join(instance="host-1"))  # the client restarted
    assert again.generation_id == 1 and again.member_id != member
    assert harness.wait(harness.sync(again.member_id, 1)).assignment == b"mine"
    # The old client, still running with the same instance id, is fenced everywhere.
    old = {"group_id": "g", "generation_id": 1, "member_id": member,
           "group_instance_id": "host-1"}
    assert harness.send(12, 4, old).error_code == ErrorCode.fenced_instance_id
    assert harness.wait(harness.send(14, 5, dict(old, protocol_type="consumer",
                                                 protocol_name="range",
                                                 assignments=[]))).error_code == \
        ErrorCode.fenced_instance_id
    assert harness.wait(harness.join(member_id=member, instance="host-1")).error_code == \
        ErrorCode.fenced_instance_id
    left = harness.send(13, 4, {"group_id": "g", "members": [
        {"member_id": member, "group_instance_id": "host-1"}]})
    assert [m.error_code for m in left.members] == [ErrorCode.fenced_instance_id]
    assert harness.heartbeat(again.member_id, 1) == ErrorCode.none  # the new one is untouched


def test_offset_commits_are_checked_durable_and_expire(harness):
    assert codes(harness.commit({("t", 0): 5, ("t", 1): 7})) == [ErrorCode.none, ErrorCode.none]
    assert codes(harness.commit({("nope", 0): 1})) == [ErrorCode.unknown_topic_or_partition]
    assert codes(harness.commit({("t", 9): 1})) == [ErrorCode.unknown_topic_or_partition]
    assert codes(harness.commit({("t", 0): 6}, metadata="x" * 5000)) == \
        [ErrorCode.offset_metadata_too_large]
    member, join = harness.join_member()
    harness.wait(join)
    harness.wait(harness.sync(member, 1, [(member, b"")]))
    # The group has members.
    assert codes(harness.commit({("t", 0): 8})) == [ErrorCode.unknown_member_id]
    assert codes(harness.commit({("t", 0): 8}, 5, member)) == [ErrorCode.illegal_generation]
    assert codes(harness.commit({("t", 0): 8}, 1, member)) == [ErrorCode.none]
    assert harness.committed() == {("t", 0): 8, ("t", 1): 7}
    harness.restart()  # a new coordinator reads them back from the file
    assert harness.committed() == {("t", 0): 8, ("t", 1): 7}
    assert harness.committed("other") == {}
    harness.send(13, 3, {"group_id": "g", "members": [{"member_id": member,
                                                        "group_instance_id": None}]})
    # Retention counts from when the group became empty (now: its member left).
    harness.clock.ms = now_ms() + 10080 * 60000 + 1000
    assert harness.coordinator.expire_offsets() == 2
    assert harness.committed() == {}
    harness.restart()
    assert harness.committed() == {}


def test_delete_groups_refuses_live_groups(harness):
    assert codes(harness.commit({("t", 0): 1})) == [ErrorCode.none]
    member, join = harness.join_member()
    harness.wait(join)
    harness.wait(harness.sync(member, 1, [(member, b"")]))

    def delete(*names):
        answer = harness.send(42, 2, {"groups_names": list(names)})
        return [r.error_code for r in answer.results]

    assert delete("g", "ghost") == [ErrorCode.non_empty_group, ErrorCode.group_id_not_found]
    harness.send(13, 3, {"group_id": "g", "members": [{"member_id": member,
                                                       "group_instance_id": None}]})
    harness.settle(0.05)
    assert delete("g") == [ErrorCode.none]
    assert harness.committed() == {}
    harness.restart()
    assert harness.committed() == {}


def test_compaction_keeps_only_the_latest_offsets(tmp_path, monkeypatch):
    from broker.parent.groups import offset_store as offsets

    monkeypatch.setattr(offsets, "COMPACT_MIN", 10)
    store = OffsetStore(str(tmp_path))
    for offset in range(50):  # compacted as it grows, not only when the retention check runs
        store.commit([offsets.Record(group="g", topic="t", partition=0, offset=offset)])
        with open(store.path, "rb") as handle:
            assert len(handle.readlines()) <= 10
    store.close()
    store = OffsetStore(str(tmp_path))
    assert store.get("g")[("t", 0)].offset == 49
    store.close()
    with open(store.path, "ab") as handle:
        handle.write(b'{"group": "g", "top')  # a torn last line is skipped
    assert OffsetStore(str(tmp_path)).get("g")[("t", 0)].offset == 49


def test_session_timeout_bounds_must_be_ordered():
    from broker.shared.config import ConfigError

    with pytest.raises(ConfigError, match="^group.min.session.timeout.ms: 9000 is more than"):
        load_config({"group.min.session.timeout.ms": "9000",
                     "group.max.session.timeout.ms": "8000"})


def two_member_generation(harness, rebalance=5.0):
    """A leader and a follower joined into generation 2; returns (leader, follower)."""
    first, join = harness.join_member(rebalance=rebalance)
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"x")]))
    second, join_second = harness.join_member(rebalance=rebalance)
    harness.wait(harness.join(member_id=first, rebalance=rebalance))
    harness.wait(join_second)
    return first, second


def test_a_retried_sync_answers_the_first_one_too(harness):
    leader, follower = two_member_generation(harness)
    first_try = harness.sync(follower, 2)
    second_try = harness.sync(follower, 2)
    # Never left hanging.
    assert harness.wait(first_try).error_code == ErrorCode.rebalance_in_progress
    harness.wait(harness.sync(leader, 2, [(leader, b"a"), (follower, b"b")]))
    assert harness.wait(second_try).assignment == b"b"


def test_a_leader_that_never_syncs_is_dropped_after_the_rebalance_timeout(harness):
    leader, follower = two_member_generation(harness, rebalance=0.3)
    waiting = harness.sync(follower, 2)
    assert harness.wait(waiting, timeout=3).error_code == ErrorCode.rebalance_in_progress
    again = harness.wait(harness.join(member_id=follower, rebalance=0.3), timeout=3)
    assert (again.generation_id, again.leader) == (3, follower)
    assert harness.heartbeat(leader, 3) == ErrorCode.unknown_member_id


def test_shutdown_answers_every_waiting_join_and_sync(harness):
    first, join = harness.join_member()
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"x")]))
    _second, join_second = harness.join_member()
    assert not join_second.done()
    harness.coordinator.abort_waiting()
    assert harness.wait(join_second).error_code == ErrorCode.not_coordinator  # look again


def test_a_stable_group_is_stable_again_after_a_restart(harness):
    """As Kafka loads its groups: members go on with their generation and assignment, and
    each session starts over; a member that stays away is dropped by the next rebalance."""
    leader, follower = two_member_generation(harness, rebalance=0.5)
    harness.wait(harness.sync(leader, 2, [(leader, b"a"), (follower, b"b")]))
    harness.restart()
    assert harness.heartbeat(leader, 2) == harness.heartbeat(follower, 2) == ErrorCode.none
    assert harness.wait(harness.sync(follower, 2)).assignment == b"b"
    assert codes(harness.commit({("t", 0): 4}, 2, follower)) == [ErrorCode.none]
    (described,) = harness.send(15, 5, {"groups": ["g"],
                                        "include_authorized_operations": False}).groups
    assert described.group_state == "Stable" and described.protocol_data == "range"
    assert {m.member_id: m.member_assignment for m in described.members} == \
        {leader: b"a", follower: b"b"}
    rejoin = harness.join(member_id=leader, session=0.3, rebalance=0.5)
    harness.settle(0.8)  # the follower does not rejoin within the rebalance timeout
    again = harness.wait(rejoin)
    assert (again.generation_id, [m.member_id for m in again.members]) == (3, [leader])


def test_restored_sessions_start_when_the_broker_serves(harness):
    """Workers may take seconds to start after a restart: no session ends before."""
    member, join = harness.join_member(session=0.3)
    harness.wait(join)
    harness.wait(harness.sync(member, 1, [(member, b"a")]))
    harness.coordinator.close()
    harness.coordinator = harness._coordinator()  # restored, not serving yet
    harness.settle(0.7)
    assert harness.heartbeat(member, 1) == ErrorCode.none
    harness.coordinator.start()
    harness.settle(0.7)  # serving, and no heartbeat for longer than the session
    assert harness.heartbeat(member, 1) == ErrorCode.unknown_member_id


def test_a_replaced_static_member_stays_fenced_and_an_empty_group_stays_empty(harness):
    joined = harness.wait(harness.join(instance="host-1"))
    harness.wait(harness.sync(joined.member_id, 1, [(joined.member_id, b"mine")]))
    again = harness.wait(harness.join(instance="host-1"))  # the client restarted
    harness.restart()
    assert harness.send(12, 4, {"group_id": "g", "generation_id": 1,
                                "member_id": joined.member_id,
                                "group_instance_id": "host-1"}).error_code == \
        ErrorCode.fenced_instance_id
    assert harness.wait(harness.sync(again.member_id, 1)).assignment == b"mine"
    harness.send(13, 4, {"group_id": "g", "members": [{"member_id": again.member_id,
                                                        "group_instance_id": "host-1"}]})
    harness.restart()
    listed = harness.send(16, 4, {"states_filter": []})
    assert [(g.group_id, g.group_state) for g in listed.groups] == []
    assert harness.heartbeat(again.member_id, 1) == ErrorCode.unknown_member_id


def test_the_membership_file_is_rewritten_with_the_live_groups(harness, monkeypatch):
    monkeypatch.setattr(harness.coordinator.membership.records, "rewrite_min_bytes", 0)
    member, join = harness.join_member()
    harness.wait(join)
    for generation in range(1, 30):  # a rebalance each time: a record each time
        harness.wait(harness.sync(member, generation, [(member, b"x" * 100)]))
        harness.wait(harness.join(member_id=member, protocols=(("range", b"%d" % generation),)))
    store = harness.coordinator.membership
    with open(store.path, "rb") as saved:
        assert len(saved.readlines()) <= 2
    harness.restart()
    assert harness.heartbeat(member, 29) == ErrorCode.none


def test_groups_with_offsets_are_listed_after_a_restart(harness):
    assert codes(harness.commit({("t", 0): 3})) == [ErrorCode.none]
    harness.restart()
    listed = harness.send(16, 4, {"states_filter": []})
    assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Empty")]


def test_a_commit_after_a_torn_tail_survives_the_next_restart(tmp_path):
    store = OffsetStore(str(tmp_path))
    store.commit([offsets_record("t", 0, 1)])
    store.close()
    with open(store.path, "ab") as handle:
        handle.write(b'{"group": "g", "topic": "t", "parti')  # killed mid-write
    store = OffsetStore(str(tmp_path))
    store.commit([offsets_record("t", 0, 42)])
    store.close()
    assert OffsetStore(str(tmp_path)).get("g")[("t", 0)].offset == 42


def offsets_record(topic, partition, offset):
    from broker.parent.groups.offsets import Record

    return Record(group="g", topic=topic, partition=partition, offset=offset)


def test_list_groups_filters_are_case_insensitive(harness):
    """ListGroups v5 compares states and types as Kafka does, ignoring case."""
    first, join = harness.join_member()
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"x")]))
    for states, types in ((["STABLE"], ["CLASSIC"]), (["stable"], ["Classic"]),
                          ([], ["CLASSIC"])):
        listed = harness.send(16, 5, {"states_filter": states, "types_filter": types})
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Stable")]
    assert harness.send(16, 5, {"states_filter": ["EMPTY"], "types_filter": []}).groups == ()
    assert harness.send(16, 5, {"states_filter": [], "types_filter": ["CONSUMER"]}).groups == ()


def test_a_stale_commit_during_completing_rebalance_hears_who_it_is_first(harness):
    """In CompletingRebalance a commit from an old generation or an unknown member
    gets ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID (librdkafka rejoins); only a member of the
    current generation gets REBALANCE_IN_PROGRESS."""
    first, join = harness.join_member()
    harness.wait(join)
    harness.wait(harness.sync(first, 1, [(first, b"x")]))
    second, join_second = harness.join_member()
    rejoin = harness.join(member_id=first)
    harness.wait(rejoin)
    harness.wait(join_second)  # generation 2, waiting for the leader's sync

    def codes(answer) -> set[int]:
        return {p.error_code for t in answer.topics for p in t.partitions}

    assert codes(harness.commit({("t", 0): 5}, generation=1, member_id=first)) == \
        {ErrorCode.illegal_generation}
    assert codes(harness.commit({("t", 0): 5}, generation=2, member_id="nobody")) == \
        {ErrorCode.unknown_member_id}
    assert codes(harness.commit({("t", 0): 5}, generation=2, member_id=first)) == \
        {ErrorCode.rebalance_in_progress}
