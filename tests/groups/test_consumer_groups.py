"""Consumer groups of the KIP-848 protocol in process: the assignors, the reconciliation step,
and ConsumerGroupHeartbeat/ConsumerGroupDescribe through `ConsumerGroups` with a fake clock and
a fake topic registry, including a randomised run of members joining, leaving, expiring and
topics growing in which no partition is ever owned by two members."""

import asyncio
import datetime
import random
import uuid

import msgspec
import pytest
from kio.schema.errors import ErrorCode

from broker.parent.forwarded import decode_forwarded
from broker.parent.groups.assignors import chosen_assignor, range_assignor, uniform
from broker.parent.groups.consumer import ConsumerGroups
from broker.parent.groups.consumer_state import MemberState
from broker.parent.groups.consumer_store import ConsumerGroupStore
from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offset_store import OffsetStore
from broker.shared.access import Access
from broker.shared.acl import Acl, Operation, PatternType, Permission, ResourceType
from broker.shared.config import load_config
from broker.shared.log.topics import Epoch, TopicInfo
from tests.groups.helpers import Events
from tests.wire import decode_response, request

T1, T2, T3 = (uuid.UUID(int=n) for n in (1, 2, 3))


def _count(assignment) -> int:
    return sum(len(ps) for ps in assignment.values())


def _flat(assignment) -> set:
    return {(topic, p) for topic, ps in assignment.items() for p in ps}


# --- assignors ------------------------------------------------------------------------------

def test_uniform_balances_and_covers_every_partition():
    members = {f"m{i}": frozenset({T1, T2}) for i in range(3)}
    target = uniform(members, {T1: 4, T2: 3}, {})
    assert sorted(_count(a) for a in target.values()) == [2, 2, 3]
    owned = [tp for a in target.values() for tp in _flat(a)]
    assert len(owned) == len(set(owned)) == 7


def test_uniform_is_sticky_when_a_member_joins():
    members = {"a": frozenset({T1}), "b": frozenset({T1})}
    first = uniform(members, {T1: 6}, {})
    members["c"] = frozenset({T1})
    second = uniform(members, {T1: 6}, first)
    assert [_count(second[m]) for m in "abc"] == [2, 2, 2]
    for m in "ab":  # each keeps two of its three: only two partitions move
        assert _flat(second[m]) <= _flat(first[m])


def test_uniform_respects_heterogeneous_subscriptions():
    members = {"a": frozenset({T1}), "b": frozenset({T1, T2}), "c": frozenset({T2})}
    target = uniform(members, {T1: 3, T2: 3}, {})
    assert all(topic in members[m] for m, a in target.items() for topic in a)
    assert max(map(_count, target.values())) - min(map(_count, target.values())) <= 1
    assert sum(map(_count, target.values())) == 6


def test_range_gives_contiguous_ranges_in_member_order():
    members = {"b": frozenset({T1}), "a": frozenset({T1})}
    target = range_assignor(members, {T1: 5}, {})
    assert target["a"] == {T1: frozenset({0, 1, 2})}
    assert target["b"] == {T1: frozenset({3, 4})}


def test_the_assignor_most_members_name_wins():
    assert chosen_assignor(("uniform", "range"), [None, None]) == "uniform"
    assert chosen_assignor(("uniform", "range"), ["range", "range", "uniform"]) == "range"


# --- heartbeats, in process -------------------------------------------------------------------

class FakeTopics:
    """The topic registry as the coordinator reads it: names, ids, partitions, an epoch."""

    def __init__(self, counts: dict[str, int]):
        self.epoch = Epoch()
        self._topics = {}
        for name, count in counts.items():
            self.set(name, count)

    def set(self, name: str, count: int) -> None:
        known = self._topics.get(name)
        topic_id = known.topic_id if known else uuid.uuid5(uuid.NAMESPACE_DNS, name)
        self._topics[name] = TopicInfo(name, topic_id, tuple(str(i) for i in range(count)))
        self.epoch.bump()

    def topics(self):
        return self._topics

    def id(self, name: str) -> uuid.UUID:
        return self._topics[name].topic_id


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Groups:
    def __init__(self, tmp_path, topics=None, access=None, **settings):
        raw = {"log.dirs": str(tmp_path), "group.consumer.min.heartbeat.interval.ms": "10",
               "group.consumer.min.session.timeout.ms": "100",
               "group.consumer.heartbeat.interval.ms": "100"}
        raw.update({key.replace("_", "."): value for key, value in settings.items()})
        self.props = load_config(raw).props
        self.directory = str(tmp_path)
        self.topics = FakeTopics(topics or {"t": 4})
        self.clock = Clock()
        self.access = access or Access(False)
        self.events = Events()
        self.table: dict = {}
        self.groups = self._groups()

    def _groups(self) -> ConsumerGroups:
        groups = ConsumerGroups(self.props, self.access, self.table, self.topics,
                                ConsumerGroupStore(self.directory), lambda: 0, self.clock,
                                events=self.events)
        groups.restore()
        return groups

    def restart(self) -> None:
        self.groups.store.close()
        self.table.clear()
        self.groups = self._groups()
        self.groups.start()

    def send(self, api_key: int, version: int, values: dict):
        frame = request(api_key, version, values)
        ctx, body = decode_forwarded(frame, 0, "10.1.2.3:4567", "alice")
        handler = self.groups.heartbeat if api_key == 68 else self.groups.describe
        return decode_response(api_key, version, handler(ctx, body, ctx.host)[4:])[1]

    def heartbeat(self, member_id, epoch, topics=("t",), owned=None, instance=None,
                  regex=None, assignor=None, rebalance_ms=5000, group="g", version=1):
        if epoch == 0 and owned is None:
            owned = {}
        return self.send(68, version, {
            "group_id": group, "member_id": member_id, "member_epoch": epoch,
            "instance_id": instance, "rack_id": None,
            "rebalance_timeout": datetime.timedelta(milliseconds=rebalance_ms),
            "subscribed_topic_names": None if topics is None else list(topics),
            "subscribed_topic_regex": regex, "server_assignor": assignor,
            "topic_partitions": None if owned is None else [
                {"topic_id": topic, "partitions": sorted(ps)} for topic, ps in owned.items()]})

    def describe(self, *groups):
        return self.send(69, 1, {"group_ids": list(groups),
                                 "include_authorized_operations": False}).groups


def _assignment(answer) -> dict:
    return {part.topic_id: frozenset(part.partitions)
            for part in answer.assignment.topic_partitions}


class Client:
    """A consumer as the protocol expects one to behave: it takes what the answers assign,
    gives up at once what they no longer hold, and reports what it owns."""

    def __init__(self, harness, member_id: str, topics=("t",), instance=None):
        self.harness = harness
        self.member_id = member_id
        self.topics = topics
        self.instance = instance
        self.epoch = 0
        self.owned: dict = {}

    def beat(self, full: bool = False):
        answer = self.harness.heartbeat(self.member_id, self.epoch, self.topics,
                                        owned=self.owned, instance=self.instance)
        if answer.error_code == ErrorCode.none:
            self.epoch = answer.member_epoch
            if answer.assignment is not None:
                self.owned = _assignment(answer)
        elif answer.error_code in (ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id):
            self.epoch, self.owned = 0, {}  # it lost its partitions; it joins again
        return answer


def test_a_member_joins_and_gets_every_partition(tmp_path):
    h = Groups(tmp_path)
    answer = h.heartbeat("m1", 0)
    assert answer.error_code == ErrorCode.none
    assert answer.member_epoch == 1 and answer.member_id == "m1"
    assert answer.heartbeat_interval == datetime.timedelta(milliseconds=100)
    assert _assignment(answer) == {h.topics.id("t"): frozenset(range(4))}
    nothing_new = h.heartbeat("m1", 1, topics=None)
    assert nothing_new.error_code == ErrorCode.none and nothing_new.assignment is None


def test_v0_member_ids_are_made_by_the_broker(tmp_path):
    h = Groups(tmp_path)
    answer = h.heartbeat("", 0, version=0)
    assert answer.error_code == ErrorCode.none and len(answer.member_id) == 22


def test_revocation_comes_before_assignment(tmp_path):
    h = Groups(tmp_path)
    first, second = Client(h, "a"), Client(h, "b")
    first.beat()
    assert len(first.owned[h.topics.id("t")]) == 4
    second.beat()  # joins: the target splits, but "a" still owns everything
    assert second.epoch == 2 and second.owned == {}
    group = h.table["g"]
    assert group.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    answer = first.beat()  # told to give two up: epoch unchanged until it has
    assert answer.member_epoch == 1 and len(first.owned[h.topics.id("t")]) == 2
    assert group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    first.beat()  # reports it let them go: the new epoch
    assert first.epoch == 2 and group.members["a"].state is MemberState.STABLE
    second.beat()
    assert len(second.owned[h.topics.id("t")]) == 2
    assert not _flat(first.owned) & _flat(second.owned)
    assert group.state.value == "Stable"


def test_epochs_are_fenced_as_kafka_does(tmp_path):
    h = Groups(tmp_path)
    everything = _assignment(h.heartbeat("m", 0))
    assert h.heartbeat("m", 5).error_code == ErrorCode.fenced_member_epoch
    assert h.heartbeat("nobody", 1).error_code == ErrorCode.unknown_member_id
    h.heartbeat("other", 0)  # group epoch 2: "m" keeps epoch 1 until it gives two up
    kept = _assignment(h.heartbeat("m", 1, owned=everything))
    assert _count(kept) == 2
    assert h.heartbeat("m", 1, owned=kept).member_epoch == 2
    # The answer that bumped it was lost: the previous epoch with a subset is accepted...
    again = h.heartbeat("m", 1, owned=kept)
    assert (again.error_code, again.member_epoch) == (ErrorCode.none, 2)
    # ...but not without saying what it owns, nor with more than it holds.
    assert h.heartbeat("m", 1, owned=None).error_code == ErrorCode.fenced_member_epoch
    assert h.heartbeat("m", 1, owned=everything).error_code == ErrorCode.fenced_member_epoch


@pytest.mark.parametrize("values, message", [
    ({"group": ""}, "GroupId can't be empty."),
    ({"member_id": ""}, "MemberId can't be empty."),
    ({"owned": {T1: frozenset({0})}}, "TopicPartitions must be empty when (re-)joining."),
    ({"instance": ""}, "InstanceId can't be empty."),
])
def test_invalid_requests_are_refused_with_kafkas_message(tmp_path, values, message):
    h = Groups(tmp_path)
    arguments = {"member_id": "m", "epoch": 0, **values}
    answer = h.heartbeat(arguments.pop("member_id"), arguments.pop("epoch"), **arguments)
    assert answer.error_code == ErrorCode.invalid_request
    assert answer.error_message == message


def test_unknown_assignor_and_bad_regex_are_refused(tmp_path):
    h = Groups(tmp_path)
    assert h.heartbeat("m", 0, assignor="sticky").error_code == ErrorCode.unsupported_assignor
    assert h.heartbeat("m", 0, topics=None, regex="(").error_code == \
        ErrorCode.invalid_regular_expression


def test_regex_subscriptions_pick_up_new_topics(tmp_path):
    h = Groups(tmp_path, topics={"orders-1": 1, "other": 1})
    answer = h.heartbeat("m", 0, topics=None, regex="orders-.*")
    assert _assignment(answer) == {h.topics.id("orders-1"): frozenset({0})}
    h.topics.set("orders-2", 2)  # created later: the next heartbeat sees it
    answer = h.heartbeat("m", 1, topics=None, owned=_assignment(answer))
    assert answer.member_epoch == 2
    assert _assignment(answer) == {h.topics.id("orders-1"): frozenset({0}),
                                   h.topics.id("orders-2"): frozenset({0, 1})}


def test_a_static_member_takes_its_place_back_without_a_rebalance(tmp_path):
    h = Groups(tmp_path)
    answer = h.heartbeat("m1", 0, instance="i")
    assert h.heartbeat("m2", 0, instance="i").error_code == ErrorCode.unreleased_instance_id
    assert h.heartbeat("m1", -2, instance="i").member_epoch == -2
    epoch = h.table["g"].group_epoch
    again = h.heartbeat("m2", 0, instance="i")
    assert again.error_code == ErrorCode.none and again.member_epoch == answer.member_epoch
    assert _assignment(again) == _assignment(answer)
    assert h.table["g"].group_epoch == epoch
    assert h.heartbeat("m1", 1, instance="i").error_code == ErrorCode.unknown_member_id


def test_sessions_and_rebalance_timeouts_remove_members(tmp_path):
    h = Groups(tmp_path, group_consumer_session_timeout_ms="1000")
    a, b = Client(h, "a"), Client(h, "b")
    for _ in range(3):
        a.beat(), b.beat()
    h.clock.now += 1.1  # "a" stops heartbeating; "b" does not
    b.beat()
    h.groups.expire(h.clock.now)
    assert set(h.table["g"].members) == {"b"}
    b.beat()
    everything = b.owned
    assert _count(everything) == 4
    c = Client(h, "c")
    c.beat()
    # "b" heartbeats but never gives two partitions up: fenced after its rebalance timeout.
    for _ in range(7):  # its deadline counts from its first heartbeat told to revoke
        h.clock.now += 0.9
        answer = h.heartbeat("b", b.epoch, topics=None, owned=everything)
        c.beat()
        h.groups.expire(h.clock.now)
    assert answer.member_epoch == b.epoch
    assert set(h.table["g"].members) == {"c"}
    c.beat()
    assert _count(c.owned) == 4


def test_leaving_frees_the_partitions(tmp_path):
    h = Groups(tmp_path)
    a, b = Client(h, "a"), Client(h, "b")
    for _ in range(3):
        a.beat(), b.beat()
    assert h.heartbeat("a", a.epoch, topics=None).error_code == ErrorCode.none
    assert h.heartbeat("a", -1).member_epoch == -1
    b.beat()
    assert len(b.owned[h.topics.id("t")]) == 4


def test_acls_decide_who_joins_what_it_names_and_what_its_expression_matches(tmp_path):
    def allow(resource_type, name, operation):
        return Acl(resource_type, name, PatternType.LITERAL, "User:alice", "*", operation,
                   Permission.ALLOW)

    access = Access(True)
    access.update([allow(ResourceType.GROUP, "g", Operation.READ),
                   allow(ResourceType.TOPIC, "t-open", Operation.DESCRIBE)])
    h = Groups(tmp_path, topics={"t-open": 1, "t-closed": 1}, access=access)
    assert h.heartbeat("m", 0, group="other").error_code == ErrorCode.group_authorization_failed
    refused = h.heartbeat("m", 0, topics=("t-open", "t-closed"))
    assert (refused.error_code, refused.error_message) == (
        ErrorCode.topic_authorization_failed, "Unauthorized topics: t-closed.")
    joined = h.heartbeat("m", 0, topics=(), regex="t-.*")
    assert _assignment(joined) == {h.topics.id("t-open"): frozenset({0})}
    allowed, denied = h.describe("g", "other")  # READ implies DESCRIBE, as in Kafka
    assert (allowed.error_code, denied.error_code) == (ErrorCode.none,
                                                       ErrorCode.group_authorization_failed)
    access.update([allow(ResourceType.GROUP, "g", Operation.READ)])  # t-open hidden now
    hidden, = h.describe("g")
    assert (hidden.error_code, hidden.members) == (ErrorCode.topic_authorization_failed, ())


def test_each_new_group_epoch_is_an_event_with_its_reason(tmp_path):
    h = Groups(tmp_path, group_consumer_session_timeout_ms="1000")
    h.heartbeat("a", 0)
    h.heartbeat("b", 0)
    h.heartbeat("a", 1, topics=("t", "u"))
    h.heartbeat("a", -1)
    h.clock.now += 2
    h.groups.expire(h.clock.now)
    assert [(e.group, e.group_type, e.epoch, e.members, e.reason) for e in h.events.emitted] == [
        ("g", "consumer", 1, 1, "member joined"), ("g", "consumer", 2, 2, "member joined"),
        ("g", "consumer", 3, 2, "subscription changed"), ("g", "consumer", 4, 1, "left the group"),
        ("g", "consumer", 5, 0, "session expired")]


def test_describe_shows_members_target_and_epochs(tmp_path):
    h = Groups(tmp_path)
    h.heartbeat("m", 0)
    described, = h.describe("g")
    assert described.error_code == ErrorCode.none
    assert (described.group_state, described.group_epoch, described.assignment_epoch,
            described.assignor_name) == ("Stable", 1, 1, "uniform")
    member, = described.members
    assert member.member_id == "m" and member.subscribed_topic_names == ("t",)
    assert member.assignment.topic_partitions[0].topic_name == "t"
    missing, = h.describe("nope")
    assert missing.error_code == ErrorCode.group_id_not_found


def test_a_restart_keeps_epochs_members_and_assignments(tmp_path):
    h = Groups(tmp_path)
    a, b = Client(h, "a"), Client(h, "b")
    for _ in range(3):
        a.beat(), b.beat()
    before = {m: (x.epoch, x.assigned) for m, x in h.table["g"].members.items()}
    h.restart()
    after = {m: (x.epoch, x.assigned) for m, x in h.table["g"].members.items()}
    assert after == before
    assert a.beat().error_code == ErrorCode.none and b.beat().error_code == ErrorCode.none


def test_random_membership_never_owns_a_partition_twice(tmp_path):
    """Members join, heartbeat, leave, time out and topics grow in a random order (seeded):
    at every step the partitions the live clients hold are disjoint, and once things are
    quiet the group settles with every partition held."""
    h = Groups(tmp_path, topics={"t": 6, "u": 3}, group_consumer_session_timeout_ms="1000")
    rng = random.Random(848)
    clients: dict[str, Client] = {}
    serial = 0
    for _ in range(600):
        roll = rng.random()
        if roll < 0.08 and len(clients) < 6:
            serial += 1
            clients[f"m{serial}"] = Client(h, f"m{serial}", topics=rng.choice(
                [("t",), ("t", "u"), ("u",)]))
        elif roll < 0.12 and clients:
            gone = clients.pop(rng.choice(sorted(clients)))
            if gone.epoch > 0:
                h.heartbeat(gone.member_id, -1)
        elif roll < 0.14 and clients:  # one dies silently: its session runs out
            clients.pop(rng.choice(sorted(clients)))
            h.clock.now += 1.1
            for client in clients.values():
                client.beat()
            h.groups.expire(h.clock.now)
        elif roll < 0.15:
            h.topics.set("t", len(h.topics.topics()["t"].directories) + 1)
        elif clients:
            clients[rng.choice(sorted(clients))].beat()
        held = [tp for client in clients.values() for tp in _flat(client.owned)]
        assert len(held) == len(set(held)), "a partition is owned by two members"
    for _ in range(10):
        for client in clients.values():
            client.beat()
    group = h.table["g"]
    if clients:
        assert group.state.value == "Stable"
        held = set().union(*(_flat(c.owned) for c in clients.values()))
        assert held == set(group.owners)


# --- both kinds of group in one coordinator ------------------------------------------------------

class Coordinated(Groups):
    """The whole group coordinator (classic and consumer groups, offsets, listing), requests
    handed to it as a worker forwards them."""

    def _groups(self):
        self.props = msgspec.structs.replace(self.props, group_initial_rebalance_delay_ms=0)
        self.coordinator = GroupCoordinator(
            asyncio.new_event_loop(), self.props, OffsetStore(self.directory),
            lambda name: self.topics.topics()[name].partitions if name in self.topics.topics()
            else None, topics=self.topics)
        self.table = self.coordinator.groups
        self.coordinator.consumers.clock = self.clock
        return self.coordinator.consumers

    def restart(self) -> None:
        self.coordinator.close()
        self.groups = self._groups()
        self.coordinator.start()

    def send(self, api_key: int, version: int, values: dict):
        answer = self.coordinator.handle(request(api_key, version, values), 0, "10.1.2.3:4567")
        if isinstance(answer, asyncio.Future):  # a join waiting for its rebalance
            answer = self.coordinator.loop.run_until_complete(asyncio.wait_for(answer, 5))
        return decode_response(api_key, version, answer[4:])[1]

    def join_classic(self):
        return self.send(11, 5, {
            "group_id": "g", "session_timeout": datetime.timedelta(seconds=10),
            "rebalance_timeout": datetime.timedelta(seconds=5), "member_id": "",
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]})

    def commit(self, member_id, epoch, version=9, offset=5):
        answer = self.send(8, version, {
            "group_id": "g", "generation_id_or_member_epoch": epoch, "member_id": member_id,
            "group_instance_id": None, "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": offset,
                 "committed_metadata": None}]}]})
        return answer.topics[0].partitions[0].error_code

    def fetch(self, member_id=None, epoch=-1):
        answer = self.send(9, 9, {"groups": [{"group_id": "g", "member_id": member_id,
                                               "member_epoch": epoch, "topics": None}],
                                  "require_stable": False})
        group = answer.groups[0]
        offsets = {p.partition_index: p.committed_offset for t in group.topics
                   for p in t.partitions}
        return group.error_code, offsets

    def listed(self, *types):
        return [(g.group_id, g.group_state, g.group_type) for g in self.send(16, 5, {
            "states_filter": [], "types_filter": list(types)}).groups]


def test_offsets_of_a_consumer_group_are_checked_by_member_epoch(tmp_path):
    h = Coordinated(tmp_path)
    assert h.commit("", -1) == ErrorCode.none  # no group yet: a simple consumer's commit
    joined = h.heartbeat("m", 0)
    assert joined.error_code == ErrorCode.none  # the classic group of the offsets gives way
    assert h.fetch() == (ErrorCode.none, {0: 5})  # its offsets are the group's
    assert h.commit("m", 1, offset=7) == ErrorCode.none
    assert h.commit("m", 2) == ErrorCode.stale_member_epoch
    assert h.commit("m", 1, version=8) == ErrorCode.unsupported_version
    assert h.commit("nobody", 1) == ErrorCode.unknown_member_id
    assert h.commit("", -1) == ErrorCode.unknown_member_id  # not while it has members
    assert h.fetch("m", 1) == (ErrorCode.none, {0: 7})
    assert h.fetch("m", 3)[0] == ErrorCode.stale_member_epoch
    assert h.fetch("nobody", 1)[0] == ErrorCode.unknown_member_id


def test_a_group_is_of_one_kind_at_a_time(tmp_path):
    h = Coordinated(tmp_path)
    classic = h.join_classic()  # MEMBER_ID_REQUIRED: a pending member, the group in use
    assert classic.error_code == ErrorCode.member_id_required
    refused = h.heartbeat("m", 0)
    assert (refused.error_code, refused.error_message) == (
        ErrorCode.group_id_not_found, "Group g is not a consumer group.")
    h.send(11, 5, {"group_id": "g", "session_timeout": datetime.timedelta(seconds=10),
                   "rebalance_timeout": datetime.timedelta(seconds=5),
                   "member_id": classic.member_id, "group_instance_id": None,
                   "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]})
    h.send(13, 4, {"group_id": "g", "members": [{"member_id": classic.member_id,
                                                   "group_instance_id": None}]})
    assert h.heartbeat("m", 0).error_code == ErrorCode.none  # empty now: it becomes a consumer group
    assert h.listed() == [("g", "Stable", "consumer")]
    assert h.listed("classic") == []
    assert h.join_classic().error_code == ErrorCode.inconsistent_group_protocol
    assert h.send(12, 4, {"group_id": "g", "generation_id": 1, "member_id": "m",
                          "group_instance_id": None}).error_code == ErrorCode.unknown_member_id
    old = h.send(15, 5, {"groups": ["g"], "include_authorized_operations": False}).groups[0]
    assert (old.error_code, old.group_state, old.members) == (ErrorCode.none, "Dead", ())
    new = h.send(15, 6, {"groups": ["g"], "include_authorized_operations": False}).groups[0]
    assert (new.error_code, new.group_state) == (ErrorCode.group_id_not_found, "Dead")
    assert h.send(42, 2, {"groups_names": ["g"]}).results[0].error_code == \
        ErrorCode.non_empty_group
    h.heartbeat("m", -1)
    assert h.listed("consumer") == [("g", "Empty", "consumer")]
    assert h.join_classic().error_code == ErrorCode.member_id_required  # classic again
    assert [kind for _, _, kind in h.listed()] == ["classic"]
    h.restart()  # the consumer group's record was forgotten when it gave way
    assert h.listed("consumer") == [] and h.describe("g")[0].error_code == \
        ErrorCode.group_id_not_found


def test_deleting_an_empty_consumer_group_forgets_it_across_a_restart(tmp_path):
    h = Coordinated(tmp_path)
    h.heartbeat("m", 0)
    assert h.commit("m", 1) == ErrorCode.none
    refused = h.send(47, 0, {"group_id": "g", "topics": [{"name": "t", "partitions": [
        {"partition_index": 0}]}]})
    assert refused.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic
    h.heartbeat("m", -1)
    assert h.send(42, 2, {"groups_names": ["g"]}).results[0].error_code == ErrorCode.none
    h.restart()
    assert h.listed() == []
    assert h.describe("g")[0].error_code == ErrorCode.group_id_not_found


def test_a_restarted_coordinator_counts_sessions_from_when_it_serves(tmp_path):
    h = Coordinated(tmp_path, group_consumer_session_timeout_ms="1000")
    h.heartbeat("m", 0)
    h.restart()
    h.clock.now += 5  # long before the broker served again: not counted
    h.coordinator.consumers.start()
    h.coordinator.consumers.expire(h.clock.now + 0.5)
    assert list(h.table["g"].members) == ["m"]
    h.coordinator.consumers.expire(h.clock.now + 1.1)
    assert h.table["g"].members == {}


def test_a_consumer_group_is_bounded_in_members(tmp_path):
    h = Groups(tmp_path, group_consumer_max_size="1")
    assert h.heartbeat("a", 0).error_code == ErrorCode.none
    full = h.heartbeat("b", 0)
    assert (full.error_code, full.error_message) == (
        ErrorCode.group_max_size_reached,
        "The consumer group has reached its maximum capacity of 1 members.")
    assert h.heartbeat("a", 0).error_code == ErrorCode.none  # a member joining again fits


def test_a_static_member_cannot_take_another_members_id(tmp_path):
    h = Groups(tmp_path)
    h.heartbeat("a", 0)
    taken = h.heartbeat("a", 0, instance="i1")
    assert (taken.error_code, taken.error_message) == (ErrorCode.invalid_request,
                                                       "MemberId a is another member's.")


def test_expressions_are_matched_in_linear_time_as_re2(tmp_path):
    name = "customer_orders_enriched_" * 4  # ruinous for a backtracking matcher
    h = Groups(tmp_path, topics={name: 1, "X": 1})
    answer = h.heartbeat("m", 0, topics=None, regex="([a-z_]|[a-z_])*X")
    assert _assignment(answer) == {h.topics.id("X"): frozenset({0})}


def test_a_restarted_group_still_refuses_to_delete_offsets_of_its_topics(tmp_path):
    h = Coordinated(tmp_path)
    h.heartbeat("m", 0)
    h.commit("m", 1)
    h.restart()
    refused = h.send(47, 0, {"group_id": "g", "topics": [{"name": "t", "partitions": [
        {"partition_index": 0}]}]})
    assert refused.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic
