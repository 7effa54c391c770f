"""DescribeProducers answers (v0, the one version served) encoded by hand.

kio takes about 26 us to encode one producer; an answer may describe up to
`pybroker.request.max.entries` of them (2.6 s of one worker's loop).  Here a producer is one
`struct.pack` (about 0.4 us), and each partition is encoded as soon as it is described, so
what a request holds between loop turns is bytes, not dicts.  The tests compare the output
with kio's, byte for byte.
"""

from __future__ import annotations

import struct

from broker.shared.protocol.varint import uvarint

_PARTITION = struct.Struct(">ih")  # partition index, error code
# producer id, epoch, last sequence, last timestamp, coordinator epoch, current txn start
# offset, then no tagged fields
_PRODUCER = struct.Struct(">qiiqiqB")
_NO_COORDINATOR_EPOCH = -1
_NO_TAGS = b"\0"


def partition(index: int, error_code: int, message: str | None, producers=()) -> bytes:
    """One PartitionResponse; `producers` are broker.shared.log.producers.ProducerState."""
    pack = _PRODUCER.pack
    return b"".join((
        _PARTITION.pack(index, error_code), _nullable_string(message),
        uvarint(len(producers) + 1),
        *[pack(state.producer_id, state.epoch, state.last_sequence, state.last_timestamp,
               _NO_COORDINATOR_EPOCH, state.current_txn_start_offset, 0) for state in producers],
        _NO_TAGS))


def body(topics: list[tuple[str, list[bytes]]], throttle_ms: int = 0) -> bytes:
    """The response body (after its header) from (topic name, encoded partitions) pairs."""
    out = [struct.pack(">i", throttle_ms), uvarint(len(topics) + 1)]
    for name, partitions in topics:
        out += (_nullable_string(name), uvarint(len(partitions) + 1), *partitions, _NO_TAGS)
    out.append(_NO_TAGS)
    return b"".join(out)


def _nullable_string(text: str | None) -> bytes:
    if text is None:
        return b"\0"
    data = text.encode()
    return uvarint(len(data) + 1) + data
