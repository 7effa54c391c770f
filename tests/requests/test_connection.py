"""The per-connection protocol with a fake transport: framing, ordering, flow control."""

import os
import struct

import pytest

from tests.helpers import connect, feed
from tests.wire import api_versions_request, metadata_request
from workers.frame_maps import FrameMaps
from workers.mute import MuteState


def test_pipelined_requests_get_one_write_in_order():
    conn, transport, worker = connect()
    feed(conn, b"".join(api_versions_request(3, correlation_id=i) if i % 3 else
                        metadata_request(12, correlation_id=i) for i in range(30)))
    assert len(transport.writes) == 1
    assert transport.responses() == list(range(30))
    assert worker.served.count(3) == 10 and worker.served.count(18) == 20
    assert conn.state is MuteState.NOT_MUTED and conn.is_idle()


@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_frames_split_anywhere_are_reassembled(chunk):
    conn, transport, _ = connect()
    feed(conn, b"".join(api_versions_request(3, correlation_id=i) for i in range(10)), chunk)
    assert transport.responses() == list(range(10))
    assert conn.is_idle()


def test_a_large_frame_is_read_into_its_own_buffer():
    conn, transport, worker = connect(large_frame_bytes=64)
    topics = [f"topic-{i:04d}" for i in range(300)]  # a Metadata request of several KiB
    request = metadata_request(12, correlation_id=5, topics=topics)
    assert len(request) > len(worker.scratch)
    feed(conn, request[:100])
    assert 0 < conn.get_buffer(-1).nbytes <= len(request) - 100  # never past the frame
    feed(conn, request[100:] + api_versions_request(3, correlation_id=6))
    assert transport.responses() == [5, 6]


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_claimed_size_is_not_allocated_before_the_bytes_arrive():
    """32 connections each claim 64 MiB and send 8 bytes: 2 GiB claimed, and resident memory
    grows by what arrived (the pages written), not by the claims; a frame too small for a
    mapping gets a buffer of what arrived, doubled as more does."""
    before, held = resident_bytes(), []
    for _ in range(32):
        conn, transport, worker = connect(large_frame_bytes=64 * 1024, max_request_bytes=1 << 27)
        feed(conn, struct.pack(">i", 1 << 26) + b"\0" * 8)
        assert not transport.closed and conn.receive_overdue(conn.last_active + 3600)
        held.append(conn)
    assert resident_bytes() - before < 16 << 20
    conn, transport, worker = connect(large_frame_bytes=4096, max_request_bytes=1 << 20)
    feed(conn, struct.pack(">i", 200_000) + b"\0" * 8)  # a small frame: a small buffer
    assert len(conn._large) == 4096
    for topics, mapped in ((20000, True), (5000, False)):
        request = metadata_request(12, correlation_id=9, topics=[f"t{i}" for i in range(topics)])
        assert (len(request) > 256 * 1024) is mapped
        conn, transport, worker = connect(large_frame_bytes=1024, max_request_bytes=1 << 20)
        view, grown = memoryview(request), []
        while view:  # fed in 1 KiB reads
            buffer = conn.get_buffer(-1)
            n = min(len(buffer), len(view), 1024)
            buffer[:n] = view[:n]
            conn.buffer_updated(n)
            view = view[n:]
            if conn._large is not None and not mapped:
                grown.append((len(conn._large), conn._large_got))
        assert all(size <= max(2 * got, 1024) for size, got in grown)  # at most doubled
        assert transport.responses() == [9]
        assert not conn.receive_overdue(conn.last_active + 3600)  # nothing half-read now


def test_mappings_of_served_frames_are_reused_once_no_view_is_left():
    """A served large frame's mapping serves the next one (no fresh page faults), but never
    while a view of its last frame lives (a produce walked over several turns)."""
    request = metadata_request(12, correlation_id=3, topics=[f"t{i}" for i in range(20000)])
    conn, transport, worker = connect(large_frame_bytes=1024, max_request_bytes=1 << 20)
    maps = worker.frame_maps
    for _ in range(3):
        for start in range(0, len(request), 65536):
            feed(conn, request[start:start + 65536])
    assert transport.responses() == [3, 3, 3]
    assert (maps.created, maps.reused) == (1, 2)
    held = maps.take(len(request) - 4)  # the kept one
    view = memoryview(held)[:10]
    maps.give_back(held)
    assert maps.take(len(request) - 4) is not held and maps.created == 2  # still viewed
    del view
    assert maps.take(len(request) - 4) is held
    small = FrameMaps(256 * 1024, 512 * 1024)  # keeps at most 512 KiB
    first, second = small.take(300_000), small.take(300_000)
    small.give_back(first)
    small.give_back(second)
    assert small.kept_bytes == 512 * 1024
    with pytest.raises(ValueError):
        FrameMaps(0, 1)


def test_a_frame_without_a_mapping_falls_back_to_a_growing_buffer(monkeypatch):
    """mmap can fail (vm.max_map_count reached): the frame is still read, into a buffer of what
    arrived, doubled as more does, and served."""
    import mmap

    from workers import framing

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(framing.mmap, "mmap", refuse)
    assert framing.frame_buffer(1 << 26, 8) == bytearray(8)
    monkeypatch.setattr(framing.mmap, "mmap", mmap.mmap)
    request = metadata_request(12, correlation_id=4, topics=[f"t{i}" for i in range(20000)])
    monkeypatch.setattr(framing.mmap, "mmap", refuse)
    conn, transport, worker = connect(large_frame_bytes=1024, max_request_bytes=1 << 20)
    for start in range(0, len(request), 4096):
        feed(conn, request[start:start + 4096])
    assert transport.responses() == [4]


def test_write_backpressure_stops_serving_until_the_peer_reads():
    conn, transport, _ = connect()
    feed(conn, api_versions_request(3, correlation_id=1))
    conn.pause_writing()
    feed(conn, api_versions_request(3, correlation_id=2) + api_versions_request(3, correlation_id=3))
    assert transport.responses() == [1]
    assert not transport.reading
    assert not conn.is_idle()  # two requests wait
    conn.resume_writing()
    assert transport.responses() == [1, 2, 3]
    assert transport.reading


@pytest.mark.parametrize("size, reason", [(-1, "size_negative"), (1025, "size_too_large")])
def test_bad_size_closes_before_allocating(size, reason):
    conn, transport, worker = connect(max_request_bytes=1024)
    feed(conn, api_versions_request(3, correlation_id=1) + struct.pack(">i", size))
    assert transport.responses() == [1]  # the earlier request was still answered
    assert transport.closed and worker.invalid == [reason]
    assert conn.get_buffer(-1) is worker.scratch  # no buffer was set aside for the body


def test_data_after_close_is_ignored():
    conn, transport, worker = connect()
    conn.close("shutdown")
    feed(conn, api_versions_request(3, correlation_id=1))
    assert transport.writes == []
    conn.connection_lost(None)
    assert worker.closed == ["shutdown"]


def test_a_frame_dripped_a_byte_at_a_time_is_never_copied_whole_per_byte():
    """Bytes of an incomplete frame accumulate by concatenation only up to large_frame_bytes;
    past that the frame gets its own buffer, so a dripped frame costs linear copying."""
    conn, transport, worker = connect(large_frame_bytes=1024)
    request = metadata_request(12, correlation_id=3, topics=[f"t{i}" for i in range(2000)])
    assert len(request) > 10_000
    longest = 0
    for index in range(len(request)):
        feed(conn, request[index:index + 1])
        longest = max(longest, len(conn._pending))
    assert longest <= 1024 + 4
    assert transport.responses() == [3]


def test_a_client_that_takes_none_of_its_answers_is_cut_off_after_the_stall_time():
    conn, transport, _worker = connect()
    assert not conn.send_stalled(100.0)  # nothing unsent
    conn.bytes_out, transport.unsent = 5000, 3000
    assert not conn.send_stalled(101.0)  # the clock starts
    assert not conn.send_stalled(110.0)
    transport.unsent = 2000  # it took 1000 bytes: progress, the clock starts again
    assert not conn.send_stalled(110.5) and not conn.send_stalled(120.0)
    assert conn.send_stalled(120.6)
    conn.close("send_stalled")
    assert transport.aborted  # not a close that would wait for the client to read


def test_answers_piling_up_past_the_bound_close_the_connection_at_once():
    conn, transport, worker = connect()
    transport.unsent = worker.max_unsent_bytes + 1  # as if the answer went on the pile
    feed(conn, api_versions_request())
    assert transport.aborted and conn.closing
    conn.connection_lost(None)
    assert worker.closed == ["unsent_bytes"]
