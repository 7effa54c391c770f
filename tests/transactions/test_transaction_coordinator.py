"""The transaction coordinator in process: kio-encoded requests in, answers out, markers written
to a real log, state written to a real transaction log and replayed by a new coordinator."""

import asyncio
import datetime

import pytest
from kio.schema.errors import ErrorCode

from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offsets import OffsetStore
from broker.parent.transactions.coordinator import TransactionCoordinator
from broker.parent.transactions.state import IllegalTxnTransition, TxnState, transition
from broker.shared.apis import GROUP_KEYS
from broker.shared.config import load_config
from broker.shared.log import records
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import make_batch
from tests.wire import request
from tests.wire import decode_response

TOPIC = "t"


def transactional(batch: bytes) -> bytes:
    """The same batch with the transactional attribute set (CRC fixed up)."""
    from crc32c import crc32c
    import struct

    data = bytearray(batch)
    struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | records.TRANSACTIONAL)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


class Harness:
    def __init__(self, directory: str, **settings):
        raw = {"log.dirs": directory, "group.initial.rebalance.delay.ms": "0"}
        raw.update({key.replace("_", "."): value for key, value in settings.items()})
        self.props = load_config(raw).props
        self.directory = directory
        self.loop = asyncio.new_event_loop()
        self.registry = TopicRegistry((directory,), LogSettings(), Epoch())
        if self.registry.get(TOPIC) is None:
            assert self.registry.create(TOPIC, 3) is None
        self._start()

    def _start(self):
        self.offsets = OffsetStore(self.directory)
        self.groups = GroupCoordinator(self.loop, self.props, self.offsets, {TOPIC: 3}.get)
        self.coordinator = TransactionCoordinator(self.loop, self.props, self.directory,
                                                  self.registry, self.offsets)
        self.groups.transaction_problem = self.coordinator.offsets_problem
        self.coordinator.recover()

    def restart(self):
        self.groups.close()
        self.coordinator.close()
        self._start()

    def close(self):
        self.groups.close()
        self.coordinator.close()
        self.registry.close()
        self.loop.close()

    def send(self, api_key: int, version: int, values: dict, peer="10.0.0.1:1",
             user="ANONYMOUS"):
        frame = request(api_key, version, values)
        service = self.groups if api_key in GROUP_KEYS else self.coordinator
        return decode_response(api_key, version, service.handle(frame, 0, peer, user)[4:])[1]

    # --- as a transactional producer sends them ---------------------------------------------

    def init(self, txn="app", timeout_ms=60_000, producer_id=-1, epoch=-1, version=4,
             **who):
        answer = self.send(22, version, {
            "transactional_id": txn, "transaction_timeout":
            datetime.timedelta(milliseconds=timeout_ms), "producer_id": producer_id,
            "producer_epoch": epoch}, **who)
        return answer.error_code, answer.producer_id, answer.producer_epoch

    def add(self, producer, partitions, txn="app", version=3):
        producer_id, epoch = producer
        answer = self.send(24, version, {
            "v3_and_below_transactional_id": txn, "v3_and_below_producer_id": producer_id,
            "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [
                {"name": TOPIC, "partitions": list(partitions)}]})
        return {r.partition_index: r.partition_error_code
                for t in answer.results_by_topic_v3_and_below for r in t.results_by_partition}

    def end(self, producer, commit: bool, txn="app", version=3):
        producer_id, epoch = producer
        return self.send(26, version, {"transactional_id": txn, "producer_id": producer_id,
                                       "producer_epoch": epoch, "committed": commit}).error_code

    def produce(self, producer, partition: int, count: int = 2, sequence: int = 0):
        producer_id, epoch = producer
        batch = transactional(make_batch(count, producer_id, epoch, sequence))
        result = self.registry.partition(TOPIC, partition).append(batch)
        assert result.error is None, result
        return result.base_offset

    def commit_offset(self, producer, partition: int, offset: int, group="g",
                      txn="app") -> list[int]:
        """AddOffsetsToTxn, then TxnOffsetCommit of one offset: the partitions' codes."""
        producer_id, epoch = producer
        values = {"transactional_id": txn, "producer_id": producer_id, "producer_epoch": epoch,
                  "group_id": group}
        assert self.send(25, 3, values).error_code == ErrorCode.none
        answer = self.send(28, 3, dict(values, generation_id=-1, member_id="",
                                       group_instance_id=None, topics=[{
                                           "name": TOPIC, "partitions": [{
                                               "partition_index": partition,
                                               "committed_offset": offset,
                                               "committed_leader_epoch": -1,
                                               "committed_metadata": None}]}]))
        return [p.error_code for t in answer.topics for p in t.partitions]

    def describe(self, txn="app"):
        (state,) = self.send(65, 0, {"transactional_ids": [txn]}).transaction_states
        return state

    def describe_code(self, txn: str) -> int:
        """The error code alone: kio will not read the -1 start time of an error answer.
        Bytes: correlation id, header tags, throttle, array length, then the first code."""
        answer = self.coordinator.handle(request(65, 0, {"transactional_ids": [txn]}), 0,
                                         "10.0.0.1:1")
        return int.from_bytes(answer[4 + 4 + 1 + 4 + 1:][:2], "big", signed=True)


@pytest.fixture
def harness(tmp_path):
    found = Harness(str(tmp_path))
    yield found
    found.close()


def control_batches(partition):
    data, _ = partition.read(0, 1 << 20)
    return [(batch.producer_id, batch.producer_epoch) for batch in records.headers_in(data)
            if batch.attributes & records.CONTROL]


def test_illegal_state_moves_raise():
    assert transition(TxnState.ONGOING, TxnState.PREPARE_COMMIT) is TxnState.PREPARE_COMMIT
    with pytest.raises(IllegalTxnTransition):
        transition(TxnState.EMPTY, TxnState.PREPARE_COMMIT)
    with pytest.raises(IllegalTxnTransition):
        transition(TxnState.PREPARE_ABORT, TxnState.COMPLETE_COMMIT)


def test_a_commit_writes_a_marker_to_every_partition_and_moves_the_lso(harness):
    code, producer_id, epoch = harness.init()
    assert (code, epoch) == (ErrorCode.none, 0)
    producer = (producer_id, epoch)
    assert harness.add(producer, [0, 1]) == {0: ErrorCode.none, 1: ErrorCode.none}
    first = harness.produce(producer, 0)
    partition = harness.registry.partition(TOPIC, 0)
    assert partition.last_stable_offset == first < partition.high_watermark
    assert harness.describe().transaction_state == "Ongoing"
    assert harness.end(producer, commit=True) == ErrorCode.none
    assert partition.last_stable_offset == partition.high_watermark
    for index in (0, 1):
        assert control_batches(harness.registry.partition(TOPIC, index)) == [producer]
    assert control_batches(harness.registry.partition(TOPIC, 2)) == []
    assert harness.describe().transaction_state == "CompleteCommit"
    assert harness.end(producer, commit=True) == ErrorCode.none  # a retry
    assert harness.end(producer, commit=False) == ErrorCode.invalid_txn_state


def test_an_abort_is_listed_for_read_committed_fetches(harness):
    _, producer_id, epoch = harness.init()
    producer = (producer_id, epoch)
    harness.add(producer, [0])
    first = harness.produce(producer, 0)
    assert harness.end(producer, commit=False) == ErrorCode.none
    partition = harness.registry.partition(TOPIC, 0)
    assert partition.aborted_transactions(0, partition.high_watermark) == [(producer_id, first)]


def test_a_new_producer_fences_the_old_one_and_aborts_its_transaction(harness):
    _, producer_id, epoch = harness.init()
    old = (producer_id, epoch)
    harness.add(old, [0])
    harness.produce(old, 0)
    code, same_id, new_epoch = harness.init()
    # An abort, then an init.
    assert (code, same_id, new_epoch) == (ErrorCode.none, producer_id, epoch + 2)
    partition = harness.registry.partition(TOPIC, 0)
    assert control_batches(partition) == [(producer_id, epoch + 1)]
    assert partition.last_stable_offset == partition.high_watermark
    assert harness.add(old, [1]) == {1: ErrorCode.producer_fenced}
    assert harness.add(old, [1], version=1) == {1: ErrorCode.invalid_producer_epoch}
    assert harness.end(old, commit=True) == ErrorCode.producer_fenced
    zombie = partition.append(transactional(make_batch(1, producer_id, epoch, 5)))
    assert zombie.error == "invalid_producer_epoch"
    assert harness.add((producer_id, new_epoch), [1]) == {1: ErrorCode.none}


def test_requests_of_an_unknown_producer_or_a_bad_timeout_are_refused(harness):
    assert harness.add((7, 0), [0]) == {0: ErrorCode.invalid_producer_id_mapping}
    assert harness.end((7, 0), commit=True) == ErrorCode.invalid_producer_id_mapping
    assert harness.init(timeout_ms=0)[0] == ErrorCode.invalid_transaction_timeout
    assert harness.init(timeout_ms=900_001)[0] == ErrorCode.invalid_transaction_timeout
    assert harness.describe_code("nobody") == ErrorCode.transactional_id_not_found


def test_offsets_in_a_transaction_are_visible_only_after_its_commit(harness):
    _, producer_id, epoch = harness.init()
    producer = (producer_id, epoch)
    assert harness.commit_offset(producer, 0, 42) == [ErrorCode.none]

    def fetched(stable: bool):
        answer = harness.send(9, 8, {"groups": [{"group_id": "g", "topics": [
            {"name": TOPIC, "partition_indexes": [0]}]}], "require_stable": stable})
        (part,) = answer.groups[0].topics[0].partitions
        return part.error_code, part.committed_offset

    assert fetched(stable=False) == (ErrorCode.none, -1)
    assert fetched(stable=True)[0] == ErrorCode.unstable_offset_commit
    harness.restart()  # pending offsets are durable too
    assert fetched(stable=True)[0] == ErrorCode.unstable_offset_commit
    assert harness.end(producer, commit=True) == ErrorCode.none
    assert fetched(stable=True) == (ErrorCode.none, 42)
    harness.restart()
    assert fetched(stable=False) == (ErrorCode.none, 42)


def test_an_aborted_transaction_drops_its_offsets(harness):
    _, producer_id, epoch = harness.init()
    assert harness.commit_offset((producer_id, epoch), 1, 9) == [ErrorCode.none]
    assert harness.end((producer_id, epoch), commit=False) == ErrorCode.none
    assert harness.offsets.get("g") == {} and harness.offsets.pending_partitions("g") == set()


def test_a_prepared_commit_is_completed_by_the_next_start(harness):
    _, producer_id, epoch = harness.init()
    producer = (producer_id, epoch)
    harness.add(producer, [0, 2])
    harness.produce(producer, 2)
    txn = harness.coordinator.transactions["app"]
    # A crash between the Prepare line and the markers: write the line only.
    harness.coordinator._record(txn, TxnState.PREPARE_COMMIT)
    harness.restart()
    assert harness.describe().transaction_state == "CompleteCommit"
    for index in (0, 2):
        assert control_batches(harness.registry.partition(TOPIC, index)) == [producer]
    partition = harness.registry.partition(TOPIC, 2)
    assert partition.last_stable_offset == partition.high_watermark


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(harness):
    _, producer_id, epoch = harness.init(timeout_ms=1000)
    producer = (producer_id, epoch)
    harness.add(producer, [1])
    first = harness.produce(producer, 1)
    txn = harness.coordinator.transactions["app"]
    assert harness.coordinator.abort_timed_out(now=txn.started_ms + 500) == 0
    assert harness.coordinator.abort_timed_out(now=txn.started_ms + 1001) == 1
    state = harness.describe()
    assert (state.transaction_state, state.producer_epoch) == ("CompleteAbort", epoch + 1)
    partition = harness.registry.partition(TOPIC, 1)
    assert partition.aborted_transactions(0, partition.high_watermark) == [(producer_id, first)]
    assert harness.end(producer, commit=True) == ErrorCode.producer_fenced
    # KIP-360: the producer whose transaction the coordinator aborted comes back with its
    # id and epoch and gets the bumped epoch (Kafka's last epoch), once.
    assert harness.init(timeout_ms=1000, producer_id=producer_id, epoch=epoch) == (
        ErrorCode.none, producer_id, epoch + 1)


def test_idle_ids_expire_and_are_forgotten_across_restarts(harness):
    harness.init()
    txn = harness.coordinator.transactions["app"]
    limit = harness.props.transactional_id_expiration_ms
    assert harness.coordinator.expire_ids(now=txn.updated_ms + limit - 1) == 0
    assert harness.coordinator.expire_ids(now=txn.updated_ms + limit + 1) == 1
    harness.restart()
    assert harness.describe_code("app") == ErrorCode.transactional_id_not_found


def test_list_transactions_filters_by_state_and_producer(harness):
    _, first, epoch = harness.init("a")
    harness.init("b")
    harness.add((first, epoch), [0], txn="a")
    answer = harness.send(66, 1, {"state_filters": ["Ongoing"], "producer_id_filters": [],
                                  "duration_filter": -1})
    assert [(t.transactional_id, t.transaction_state) for t in answer.transaction_states] == [
        ("a", "Ongoing")]
    answer = harness.send(66, 0, {"state_filters": ["Nonsense"], "producer_id_filters": []})
    assert list(answer.unknown_state_filters) == ["Nonsense"]


def test_the_number_of_transactional_ids_is_bounded(tmp_path):
    harness = Harness(str(tmp_path), pybroker_max_transactional_ids="2",
                      pybroker_max_transactional_ids_per_principal="2")
    try:
        _, producer_id, epoch = harness.init("a")
        harness.add((producer_id, epoch), [0], txn="a")  # in a transaction: never forgotten
        assert harness.init("b")[0] == ErrorCode.none
        assert harness.init("c")[0] == ErrorCode.none  # takes idle "b"'s place
        assert set(harness.coordinator.transactions) == {"a", "c"}
        harness.add(harness.init("c")[1:], [1], txn="c")
        assert harness.init("d")[0] == 15  # COORDINATOR_NOT_AVAILABLE: all busy
    finally:
        harness.close()


def test_the_batched_form_adds_and_verifies_partitions(harness):
    _, producer_id, epoch = harness.init()

    def batched(partitions, verify_only: bool):
        answer = harness.send(24, 4, {"transactions": [{
            "transactional_id": "app", "producer_id": producer_id, "producer_epoch": epoch,
            "verify_only": verify_only, "topics": [{"name": TOPIC,
                                                    "partitions": list(partitions)}]}]})
        assert answer.error_code == ErrorCode.none
        (result,) = answer.results_by_transaction
        return {r.partition_index: r.partition_error_code
                for t in result.topic_results for r in t.results_by_partition}

    assert batched([0], verify_only=True) == {0: ErrorCode.invalid_txn_state}  # no transaction yet
    assert batched([0, 1], verify_only=False) == {0: ErrorCode.none, 1: ErrorCode.none}
    assert batched([1, 2], verify_only=True) == {1: ErrorCode.none, 2: ErrorCode.invalid_txn_state}


def test_a_transaction_open_at_a_crash_is_aborted_after_its_timeout(harness):
    _, producer_id, epoch = harness.init(timeout_ms=1000)
    harness.add((producer_id, epoch), [0])
    first = harness.produce((producer_id, epoch), 0)
    harness.restart()  # as after kill -9: the Ongoing line is the last one
    txn = harness.coordinator.transactions["app"]
    assert txn.state is TxnState.ONGOING
    assert harness.coordinator.abort_timed_out(now=txn.started_ms + 1001) == 1
    partition = harness.registry.partition(TOPIC, 0)
    assert partition.aborted_transactions(0, partition.high_watermark) == [(producer_id, first)]
    assert partition.last_stable_offset == partition.high_watermark


def test_markers_a_partition_cannot_take_are_owed_until_it_can(harness):
    _, producer_id, epoch = harness.init()
    producer = (producer_id, epoch)
    harness.add(producer, [0, 1])
    harness.produce(producer, 0)
    harness.produce(producer, 1)
    offline = harness.registry.partition(TOPIC, 1)
    offline.state[13] = 1  # W_OFFLINE: its files could not be recovered
    # Decided: the Prepare line is written.
    assert harness.end(producer, commit=True) == ErrorCode.none
    assert harness.describe().transaction_state == "PrepareCommit"
    assert control_batches(harness.registry.partition(TOPIC, 0)) == [producer]
    assert harness.end(producer, commit=True) == ErrorCode.concurrent_transactions
    assert harness.add(producer, [2]) == {2: ErrorCode.concurrent_transactions}
    assert harness.init()[0] == ErrorCode.concurrent_transactions
    assert harness.coordinator.retry_markers() == 1
    offline.state[13] = 0  # back (a restart recovered it)
    assert harness.coordinator.retry_markers() == 0
    assert harness.describe().transaction_state == "CompleteCommit"
    assert control_batches(offline) == [producer]
    assert control_batches(harness.registry.partition(TOPIC, 0)) == [producer]  # not twice
    assert offline.last_stable_offset == offline.high_watermark


def test_a_failed_complete_line_is_written_by_a_later_round(harness, monkeypatch):
    _, producer_id, epoch = harness.init()
    producer = (producer_id, epoch)
    harness.add(producer, [0])
    real_append, calls = harness.coordinator.file.append, []

    def full_disk_once(lines):
        calls.append(lines[0].state)
        if lines[0].state is TxnState.COMPLETE_COMMIT and calls.count(lines[0].state) == 1:
            raise OSError(28, "No space left on device")
        real_append(lines)

    monkeypatch.setattr(harness.coordinator.file, "append", full_disk_once)
    assert harness.end(producer, commit=True) == ErrorCode.none  # decided and marked
    assert harness.coordinator.transactions["app"].state is TxnState.PREPARE_COMMIT
    assert harness.coordinator.retry_markers() == 0
    assert harness.describe().transaction_state == "CompleteCommit"
    assert control_batches(harness.registry.partition(TOPIC, 0)) == [producer]


def test_a_transaction_no_coordinator_state_covers_is_aborted_after_two_sweeps(harness):
    rogue = (4242, 3)  # never asked InitProducerId, never added the partition
    first = harness.produce(rogue, 2)
    _, producer_id, epoch = harness.init()
    harness.add((producer_id, epoch), [2])
    legit = harness.produce((producer_id, epoch), 2)
    partition = harness.registry.partition(TOPIC, 2)
    assert partition.last_stable_offset == first
    assert harness.coordinator.abort_hanging() == 0  # seen once: maybe a race, not yet
    assert harness.coordinator.abort_hanging() == 1
    assert partition.aborted_transactions(0, partition.high_watermark) == [(4242, first)]
    assert partition.last_stable_offset == legit  # the covered transaction still holds it
    assert harness.coordinator.abort_hanging() == 0
    assert harness.end((producer_id, epoch), commit=True) == ErrorCode.none
    assert partition.last_stable_offset == partition.high_watermark


def test_a_transaction_over_many_partitions_is_marked_a_slice_per_turn(harness):
    from broker.parent.transactions.markers import MARKERS_PER_TURN

    assert harness.registry.create("wide", 2 * MARKERS_PER_TURN + 5) is None
    _, producer_id, epoch = harness.init()
    wanted = list(range(2 * MARKERS_PER_TURN + 5))
    answer = harness.send(24, 3, {
        "v3_and_below_transactional_id": "app", "v3_and_below_producer_id": producer_id,
        "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [
            {"name": "wide", "partitions": wanted}]})
    assert {r.partition_error_code for t in answer.results_by_topic_v3_and_below
            for r in t.results_by_partition} == {ErrorCode.none}
    # Decided, not all marked.
    assert harness.end((producer_id, epoch), commit=True) == ErrorCode.none
    marked = [bool(control_batches(harness.registry.partition("wide", p))) for p in wanted]
    assert sum(marked) == MARKERS_PER_TURN
    assert harness.end((producer_id, epoch), commit=True) == ErrorCode.concurrent_transactions
    for _ in range(3):  # two more turns of the loop finish it
        harness.loop.run_until_complete(asyncio.sleep(0))
    assert all(control_batches(harness.registry.partition("wide", p)) for p in wanted)
    assert harness.describe().transaction_state == "CompleteCommit"


def test_the_transaction_log_stays_small_under_many_transactions(harness):
    from broker.parent.transactions import coordinator as module

    _, producer_id, epoch = harness.init()
    for _ in range(module.COMPACT_MIN):
        harness.add((producer_id, epoch), [0])
        assert harness.end((producer_id, epoch), commit=True) == ErrorCode.none
    assert harness.coordinator.file.lines < module.COMPACT_MIN
    harness.restart()
    assert harness.describe().transaction_state == "CompleteCommit"


def test_a_zombie_cannot_fence_the_instance_that_replaced_it(harness):
    _, producer_id, epoch = harness.init()  # instance A
    assert harness.init()[2] == epoch + 1  # instance B (no id given): A is fenced
    # A again.
    assert harness.init(producer_id=producer_id, epoch=epoch)[0] == ErrorCode.producer_fenced
    assert harness.init(producer_id=producer_id, epoch=epoch, version=3)[0] == \
        ErrorCode.invalid_producer_epoch
    # B's own bump (KIP-360) works, and a retry of it (its answer lost) gets the same epoch.
    assert harness.init(producer_id=producer_id, epoch=epoch + 1) == (ErrorCode.none, producer_id,
                                                                       epoch + 2)
    assert harness.init(producer_id=producer_id, epoch=epoch + 1) == (ErrorCode.none, producer_id,
                                                                       epoch + 2)


def test_idempotent_producers_always_get_a_new_id(harness):
    answer = harness.send(22, 4, {"transactional_id": None, "transaction_timeout":
                                  datetime.timedelta(0), "producer_id": 5, "producer_epoch": 7})
    assert answer.error_code == ErrorCode.none
    assert answer.producer_id != 5 and answer.producer_epoch == 0


def test_fencing_at_the_last_epoch_keeps_the_producer_id(harness):
    _, producer_id, epoch = harness.init()
    txn = harness.coordinator.transactions["app"]
    txn.producer_epoch = 32766
    harness.add((producer_id, 32766), [0])
    harness.produce((producer_id, 32766), 0)
    assert harness.coordinator.abort_timed_out(now=txn.started_ms + txn.timeout_ms + 1) == 1
    state = harness.describe()
    assert (state.producer_id, state.producer_epoch) == (producer_id, 32767)
    assert control_batches(harness.registry.partition(TOPIC, 0)) == [(producer_id, 32767)]
    assert harness.init()[1] != producer_id  # epochs exhausted: the next instance, a new id


def test_many_partitions_that_cannot_take_markers_do_not_spin_the_loop(harness):
    from broker.parent.transactions.markers import MARKERS_PER_TURN

    count = 2 * MARKERS_PER_TURN + 5
    assert harness.registry.create("down", count) is None
    _, producer_id, epoch = harness.init()
    harness.send(24, 3, {
        "v3_and_below_transactional_id": "app", "v3_and_below_producer_id": producer_id,
        "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [
            {"name": "down", "partitions": list(range(count)) * 2}]})  # duplicates: once
    assert len(harness.coordinator.transactions["app"].partitions) == count
    for index in range(count):
        harness.registry.partition("down", index).state[13] = 1  # all offline
    attempts = []
    real = harness.coordinator._marked
    harness.coordinator._marked = lambda *args: attempts.append(1) or real(*args)
    assert harness.end((producer_id, epoch), commit=True) == ErrorCode.none
    for _ in range(10):
        harness.loop.run_until_complete(asyncio.sleep(0))
    assert len(attempts) == count  # each tried once, then left for the next round
    # Not the decision.
    assert harness.end((producer_id, epoch), commit=False) == ErrorCode.invalid_txn_state


def test_a_plain_commit_after_the_transactional_one_is_not_overwritten(harness):
    _, producer_id, epoch = harness.init()
    assert harness.commit_offset((producer_id, epoch), 0, 5) == [ErrorCode.none]
    harness.send(8, 8, {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                        "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                            {"partition_index": 0, "committed_offset": 9,
                             "committed_leader_epoch": -1, "committed_metadata": None}]}]})
    assert harness.end((producer_id, epoch), commit=True) == ErrorCode.none
    assert harness.offsets.get("g")[(TOPIC, 0)].offset == 9
    harness.restart()
    assert harness.offsets.get("g")[(TOPIC, 0)].offset == 9


def test_deleting_a_group_drops_the_offsets_a_transaction_had_pending(harness):
    _, producer_id, epoch = harness.init()
    assert harness.commit_offset((producer_id, epoch), 0, 3) == [ErrorCode.none]
    harness.offsets.delete_group("g")
    assert harness.end((producer_id, epoch), commit=True) == ErrorCode.none
    assert harness.offsets.get("g") == {}
    harness.restart()
    assert harness.offsets.get("g") == {} and harness.offsets.pending_partitions("g") == set()


def test_a_holder_at_its_share_replaces_its_own_idle_ids_and_waits_when_all_are_busy(tmp_path):
    harness = Harness(str(tmp_path), pybroker_max_transactional_ids="10",
                      pybroker_max_transactional_ids_per_principal="2")
    try:
        a, b = {"peer": "10.0.0.1:1"}, {"peer": "10.0.0.2:1"}
        harness.init("a-0", **a)
        _, producer_id, epoch = harness.init("a-1", **a)
        assert harness.init("a-2", **a)[0] == ErrorCode.none  # a-0, its least recently used, goes
        assert set(harness.coordinator.transactions) == {"a-1", "a-2"}
        harness.add((producer_id, epoch), [0], txn="a-1")
        _, producer_id, epoch = harness.init("a-2", **a)
        harness.add((producer_id, epoch), [1], txn="a-2")
        assert harness.init("a-3", **a)[0] == 15  # both busy: COORDINATOR_NOT_AVAILABLE
        assert harness.init("b-0", **b)[0] == ErrorCode.none  # another address is not held back
        assert harness.init("a-3", user="alice", **a)[0] == ErrorCode.none  # nor another principal
        assert harness.coordinator.bounds.refused == {"share": 1, "full": 0}
        assert harness.coordinator.bounds.forgotten["share"] == 1
    finally:
        harness.close()


def test_taking_over_an_id_counts_in_the_new_holders_share_and_shares_survive_a_restart(
        tmp_path):
    harness = Harness(str(tmp_path), pybroker_max_transactional_ids="10",
                      pybroker_max_transactional_ids_per_principal="2")
    try:
        a, b = {"peer": "10.0.0.1:1"}, {"peer": "10.0.0.2:1"}
        harness.init("shared", **a)
        for name in ("b-0", "b-1"):
            _, producer_id, epoch = harness.init(name, **b)
            harness.add((producer_id, epoch), [0], txn=name)
        assert harness.init("shared", **b)[0] == 15  # b's share is busy: a keeps it
        harness.restart()
        holdings = harness.coordinator.holdings
        assert holdings.held == {("ANONYMOUS", "10.0.0.1"): 1, ("ANONYMOUS", "10.0.0.2"): 2}
        assert harness.init("shared", **b)[0] == 15
        assert harness.init("shared", user="bob", **b)[0] == ErrorCode.none  # bob has room
        assert holdings.held == {("ANONYMOUS", "10.0.0.2"): 2, ("bob", ""): 1}
    finally:
        harness.close()


def test_a_full_table_forgets_the_least_recently_used_idle_id_of_the_heaviest_holder():
    from broker.parent.transactions.holders import FULL, SHARE, Holder, Holdings, Room

    holdings = Holdings(total=6, share=4)
    light, heavy, busy, newcomer = (Holder.of("ANONYMOUS", f"10.0.0.{n}") for n in range(4))
    for name in ("l-0", "l-1"):
        holdings.add(name, light, idle=True)  # the oldest ids of the table
    for name in ("h-0", "h-1", "h-2"):
        holdings.add(name, heavy, idle=True)
    holdings.add("busy", busy, idle=False)
    assert holdings.room(newcomer, new_id=True) == Room("h-0", FULL)
    holdings.remove("h-0", heavy, idle=True)
    holdings.add("h-0", heavy, idle=True)  # used again: now its most recent
    assert holdings.room(newcomer, new_id=True) == Room("h-1", FULL)
    assert holdings.room(newcomer, new_id=False) == Room()  # a take-over adds no id
    for name in ("h-0", "h-1", "h-2"):
        holdings.remove(name, heavy, idle=True)
        holdings.add(name, heavy, idle=False)
    assert holdings.room(newcomer, new_id=True) == Room("l-0", FULL)  # only light has idle
    holdings.add("h-3", heavy, idle=False)
    assert holdings.room(heavy, new_id=True) == Room(None, SHARE)
    assert holdings.busy(heavy) == 4 and holdings.largest(1) == [(heavy, 4)]
    for name in ("l-0", "l-1"):
        holdings.remove(name, light, idle=True)
    holdings.add("l-0", light, idle=False)
    holdings.add("l-1", light, idle=False)
    assert holdings.count == 7 and holdings.room(newcomer, new_id=True) == Room(None, FULL)


def test_the_transaction_lists_and_descriptions_are_kios_bytes():
    """answers.py writes what kio would, for every shape: unknown filters, names past 127
    bytes (two-byte lengths), non-ASCII names, errors, topics and a start time of -1."""
    from broker.parent.transactions.answers import (describe_transactions_body,
                                                    list_transactions_body)
    from broker.shared.protocol.codec import build, encode_entity, response_class

    def kio(api_key: int, version: int, values: dict) -> bytes:
        return encode_entity(build(response_class(api_key, version), values))

    def at(ms: int) -> datetime.datetime:
        epoch = datetime.datetime.fromtimestamp(0, tz=datetime.timezone.utc)
        return epoch + datetime.timedelta(milliseconds=ms)

    long_name, odd_name = "x" * 200, "tx-é-✓"
    listed = [("a", 1, "Ongoing"), (long_name, 2**62, "CompleteCommit"), (odd_name, 0, "Empty")]
    for version in (0, 1):
        assert list_transactions_body(0, ["Nonsense", odd_name], listed) == kio(66, version, {
            "throttle_time": datetime.timedelta(0), "error_code": ErrorCode.none,
            "unknown_state_filters": ["Nonsense", odd_name],
            "transaction_states": [{"transactional_id": name, "producer_id": producer,
                                    "transaction_state": state}
                                   for name, producer, state in listed]})
    states = [(53, "denied", "", 0, -1, -1, -1, {}),
              (0, long_name, "Ongoing", 60_000, 1_790_000_000_000, 2**62, 7,
               {"t": [0, 2], long_name: [5]}),
              (0, odd_name, "Empty", 1000, -1, 9, 0, {})]
    assert describe_transactions_body(states) == kio(65, 0, {
        "throttle_time": datetime.timedelta(0), "transaction_states": [{
            "error_code": ErrorCode(code), "transactional_id": name, "transaction_state": state,
            "transaction_timeout": datetime.timedelta(milliseconds=timeout),
            "transaction_start_time": at(started), "producer_id": producer,
            "producer_epoch": epoch, "topics": [{"topic": topic, "partitions": parts}
                                                for topic, parts in topics.items()]}
            for code, name, state, timeout, started, producer, epoch, topics in states]})


def test_a_description_past_the_answer_bound_is_refused_before_it_is_built(tmp_path):
    """Every id's partitions count against pybroker.request.max.entries before its state is
    gathered: the asker is refused (its connection closed by the router), nothing is built."""
    from broker.parent.forwarded import ResponseTooLarge

    harness = Harness(str(tmp_path), pybroker_request_max_entries="1000",
                      pybroker_max_transactional_ids_per_principal="1000")
    try:
        ids = [f"app-{number}" for number in range(300)]
        for txn in ids:
            code, producer_id, epoch = harness.init(txn)
            assert code == ErrorCode.none
            assert set(harness.add((producer_id, epoch), range(3), txn=txn).values()) == \
                {ErrorCode.none}
        few = harness.send(65, 0, {"transactional_ids": ids[:50]}).transaction_states
        assert [len(state.topics[0].partitions) for state in few] == [3] * 50
        with pytest.raises(ResponseTooLarge):
            harness.coordinator.handle(request(65, 0, {"transactional_ids": ids}), 0,
                                       "10.0.0.1:1", "ANONYMOUS")
    finally:
        harness.close()
