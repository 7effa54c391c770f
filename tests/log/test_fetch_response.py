"""The hand-encoded Fetch response (workers.fetch_response) against kio, and the log's regions.

kio is the reference: for every Fetch version the broker serves, the hand encoder's bytes
(file regions read back) must equal what kio encodes from the same answer.
"""

import datetime
import os
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.shared.log import records
from broker.shared.log.partition_state import W_HIGH_WATERMARK
from broker.shared.log.settings import LogSettings
from broker.shared.log.segment import list_bases
from broker.shared.log.topics import Epoch, TopicRegistry
from broker.shared.protocol.context import RequestContext
from tests.batches import make_batch
from workers.fetch_response import REGION_BUDGET, FileRegion, FileResponse, encode_fetch, file_piece

VERSIONS = range(4, 17)
CORRELATION = (7).to_bytes(4, "big")


class FakeSegment:
    """What `file_piece` uses of a Segment: its log's descriptor and its bytes."""

    def __init__(self, fd: int):
        self.fd = fd

    def log_fd(self) -> int:
        return self.fd

    def read(self, position: int, length: int) -> bytes:
        return os.pread(self.fd, length, position)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fetch") / "data"
    path.write_bytes(os.urandom(1 << 16))
    fd = os.open(path, os.O_RDONLY)
    yield fd, path.read_bytes()
    os.close(fd)


regions = st.lists(st.tuples(st.integers(0, 60_000), st.integers(1, 5000)), min_size=1, max_size=3)
partitions = st.fixed_dictionaries({
    "partition_index": st.integers(0, 2**31 - 1),
    "error_code": st.sampled_from([ErrorCode.none, ErrorCode.offset_out_of_range]),
    "high_watermark": st.integers(-1, 2**63 - 1),
    "last_stable_offset": st.integers(-1, 2**40),
    "log_start_offset": st.integers(-1, 2**40),
    "aborted_transactions": st.one_of(st.none(), st.lists(st.fixed_dictionaries({
        "producer_id": st.integers(0, 2**62), "first_offset": st.integers(0, 2**62)}),
        max_size=3)),
    "preferred_read_replica": st.just(-1),
    "records": st.one_of(st.none(), st.binary(max_size=40), regions),
})
topics = st.lists(st.fixed_dictionaries({
    "topic": st.text(min_size=1, max_size=20),
    "topic_id": st.uuids(),
    "partitions": st.lists(partitions, max_size=4),
}), max_size=3)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), answer=topics, throttle=st.integers(0, 10_000),
       session=st.integers(0, 2**31 - 1))
def test_the_hand_encoding_is_kio_s_for_every_version(data_file, version, answer, throttle,
                                                        session):
    fd, content = data_file
    segment = FakeSegment(fd)
    ours = [dict(topic, partitions=[
        dict(part, records=[file_piece(segment, at, length) for at, length in part["records"]])
        if isinstance(part["records"], list) else part for part in topic["partitions"]])
        for topic in answer]
    theirs = [dict(topic, partitions=[
        dict(part, records=b"".join(content[at:at + length] for at, length in part["records"]))
        if isinstance(part["records"], list) else part for part in topic["partitions"]])
        for topic in answer]
    encoded = encode_fetch(CORRELATION, version, throttle, ErrorCode.none, session, ours)
    regions_given = any(isinstance(part["records"], list) for topic in answer
                        for part in topic["partitions"])
    if regions_given:
        assert isinstance(encoded, FileResponse)
        size = encoded.size
        encoded = encoded.materialize()
        assert size == len(encoded)
    else:
        assert isinstance(encoded, bytes)
    context = RequestContext(CORRELATION, 1, version, 0, None)
    expected = context.respond({"throttle_time": datetime.timedelta(milliseconds=throttle),
                                "error_code": ErrorCode.none, "session_id": session,
                                "responses": theirs})
    assert encoded == expected


def one_partition(pieces: list) -> list:
    return [{"topic": "t", "topic_id": uuid.uuid4(), "partitions": [{
        "partition_index": 0, "error_code": ErrorCode.none, "high_watermark": 1,
        "last_stable_offset": 1, "log_start_offset": 0, "aborted_transactions": None,
        "preferred_read_replica": -1, "records": pieces}]}]


def test_a_response_closes_its_descriptors_once(data_file):
    fd, _content = data_file
    before = len(os.listdir("/proc/self/fd"))
    pieces = [file_piece(FakeSegment(fd), 0, 10) for _ in range(3)]
    response = encode_fetch(CORRELATION, 12, 0, ErrorCode.none, 0, one_partition(pieces))
    assert len(os.listdir("/proc/self/fd")) == before + 3  # a dup per region: retention may
    response.close()  # delete the segment meanwhile
    response.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_out_of_descriptors_a_region_is_read_instead(data_file, monkeypatch):
    fd, content = data_file
    before = len(os.listdir("/proc/self/fd"))
    real_dup, taken = os.dup, []

    def dup_twice(number):  # the third region meets EMFILE
        if len(taken) == 2:
            raise OSError(24, "Too many open files")
        taken.append(real_dup(number))
        return taken[-1]

    monkeypatch.setattr("workers.fetch_response.os.dup", dup_twice)
    pieces = [file_piece(FakeSegment(fd), at, 10) for at in (0, 10, 20)]
    assert [type(piece) for piece in pieces] == [FileRegion, FileRegion, bytes]
    response = encode_fetch(CORRELATION, 12, 0, ErrorCode.none, 0, one_partition(pieces))
    assert content[:30] in response.materialize()  # the bytes read stand among the regions
    assert len(os.listdir("/proc/self/fd")) == before


def test_past_the_budget_regions_are_read_and_dropped_ones_close(data_file, monkeypatch):
    fd, content = data_file
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(REGION_BUDGET, "limit", REGION_BUDGET.held + 2)
    pieces = [file_piece(FakeSegment(fd), at, 10) for at in (0, 10, 20, 30)]
    assert [type(piece) for piece in pieces] == [FileRegion, FileRegion, bytes, bytes]
    assert pieces[2] == content[20:30] and len(os.listdir("/proc/self/fd")) == before + 2
    del pieces  # an answer nobody sends (a parked read short of min_bytes): closed with it
    assert len(os.listdir("/proc/self/fd")) == before and REGION_BUDGET.room


@pytest.fixture
def partition(tmp_path):
    settings = LogSettings(segment_bytes=8192, index_interval_bytes=256, max_message_bytes=100_000)
    registry = TopicRegistry((str(tmp_path),), settings, Epoch())
    registry.create("t", 1)
    yield registry.partition("t", 0)
    registry.close()


def offsets_of(data: bytes) -> list[int]:
    return [offset for batch in records.headers_in(data)
            for offset in range(batch.base_offset, batch.next_offset)]


def test_regions_hold_whole_batches_within_the_limit(partition):
    batches = [make_batch(2, value_size=size) for size in (10, 300, 40, 900, 5) * 6]
    for batch in batches:
        partition.append(batch)
    total = sum(map(len, batches))
    assert len(list_bases(partition.directory)) > 1  # the reads cross segments
    for limit in (0, 1, 100, 500, 1500, 4000, total // 2, total, 10 * total):
        for start in (0, 3, 20, 41):
            data, high = partition.read(start, limit, at_least_one=True)
            batches = list(records.headers_in(data))
            assert sum(batch.size for batch in batches) == len(data)  # whole batches only
            assert batches[0].base_offset <= start < batches[0].next_offset
            assert len(data) <= limit or len(batches) == 1  # KIP-74: one bigger batch
            assert offsets_of(data) == list(range(batches[0].base_offset,
                                                  batches[-1].next_offset))
            following = batches[-1].next_offset
            if following < high:  # it stopped because the next batch did not fit
                after, _ = partition.read(following, 0, at_least_one=True)
                assert len(data) + len(after) > limit


def test_regions_never_reach_past_the_high_watermark(partition):
    for _ in range(10):
        partition.append(make_batch(3, value_size=100))
    # An append in another process has written its batch but not yet moved the high mark.
    partition.state[W_HIGH_WATERMARK] = 18
    data, high = partition.read(0, 1 << 20)
    assert high == 18 and offsets_of(data) == list(range(18))
    regions, _ = partition.read_regions(15, 1 << 20)
    assert sum(length for _segment, _at, length in regions) == len(make_batch(3, value_size=100))
    assert partition.read_regions(18, 1 << 20) == ([], 18)
