"""Record batches for tests, built with kafka-python's v2 batch builder."""

import time

from kafka.record.default_records import DefaultRecordBatchBuilder


def make_batch(count: int = 3, producer_id: int = -1, epoch: int = -1, sequence: int = -1,
               value_size: int = 10, key_prefix: bytes = b"k", timestamp_ms: int | None = None) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=epoch,
                                        base_sequence=sequence, batch_size=1 << 24)
    stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    for index in range(count):
        builder.append(index, timestamp=stamp, key=key_prefix + b"%d" % index,
                       value=b"v" * value_size, headers=[("h", b"%d" % index)])
    return bytes(builder.build())
