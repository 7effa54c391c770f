"""Record batches for tests, built with kafka-python's v2 batch builder."""

import time

from kafka.record.default_records import DefaultRecordBatchBuilder


def make_batch(count: int = 3, producer_id: int = -1, epoch: int = -1, sequence: int = -1,
               value_size: int = 10, key_prefix: bytes = b"k", timestamp_ms: int | None = None,
               timestamps: list[int] | None = None) -> bytes:
    """`timestamps`: one per record (then `count` is their number)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=epoch,
                                        base_sequence=sequence, batch_size=1 << 24)
    stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    stamps = timestamps if timestamps is not None else [stamp] * count
    for index, each in enumerate(stamps):
        builder.append(index, timestamp=each, key=key_prefix + b"%d" % index,
                       value=b"v" * value_size, headers=[("h", b"%d" % index)])
    return bytes(builder.build())


def compressed(batch: bytes, codec: int, xerial: bool = False) -> bytes:
    """The same records in a batch compressed with `codec` (1 gzip, 2 snappy, 3 lz4, 4 zstd);
    snappy as snappy-java frames it when `xerial`."""
    import struct

    import cramjam
    from crc32c import crc32c

    records = batch[61:]
    if codec == 2 and xerial:
        block = bytes(cramjam.snappy.compress_raw(records))
        body = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    elif codec == 2:
        body = bytes(cramjam.snappy.compress_raw(records))
    else:
        body = bytes({1: cramjam.gzip, 3: cramjam.lz4, 4: cramjam.zstd}[codec].compress(records))
    header = bytearray(batch[:61])
    struct.pack_into(">i", header, 8, 49 + len(body))  # batch length: from byte 12 on
    attributes = struct.unpack_from(">h", header, 21)[0]
    struct.pack_into(">h", header, 21, (attributes & ~7) | codec)
    whole = header + body
    struct.pack_into(">I", whole, 17, crc32c(bytes(whole[21:])))
    return bytes(whole)
