"""Writing compressed records: a topic's compression.type, and the codecs the broker writes.

A topic whose compression.type names a codec (`uncompressed`, `gzip`, `snappy`, `lz4`, `zstd`)
stores every batch in it, as Kafka does: a produced batch in another codec has its records
(decompressed first) compressed again, a slice at a time (records.BatchCheck), and the
batch's header rewritten around them.  `producer` (the default) keeps batches as produced.

What each codec writes is what Kafka's own readers take: gzip a gzip stream, snappy in
snappy-java's framing (32 KiB blocks, as Java's SnappyOutputStream), lz4 a frame of
independent blocks (Kafka's Lz4BlockInputStream refuses linked ones), zstd a frame.  Levels
are KIP-390's: compression.gzip.level (1 to 9, or -1: zlib's default), compression.lz4.level
(1 to 17; 9, the default, is lz4's fast mode, as Kafka's, any other level its
high-compression mode, which stops at 12), compression.zstd.level (-131072 to 22).
"""

from __future__ import annotations

import struct
import zlib

import cramjam

# Kafka's BrokerCompressionType, in its order (its error messages list them so).
TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
CODEC_IDS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # attributes
# codec: (least, greatest, default) level; gzip also takes -1.
LEVELS = {"gzip": (1, 9, -1), "lz4": (1, 17, 9), "zstd": (-131072, 22, 3)}
XERIAL = b"\x82SNAPPY\x00"  # snappy-java's stream magic
_XERIAL_HEADER = XERIAL + struct.pack(">ii", 1, 1)  # magic, version, compatible version
_XERIAL_BLOCK = 32 * 1024  # input bytes per snappy-java block
_LZ4_FAST = 9  # Kafka's default lz4 level: lz4-java's fast compressor


def level_problem(codec: str, level: int) -> str | None:
    """Why `level` is not one Kafka accepts for `codec` (its words), or None."""
    least, greatest, default = LEVELS[codec]
    if least <= level <= greatest or (codec == "gzip" and level == default):
        return None
    if codec == "gzip":
        return f"Value must be between {least} and {greatest} or equal to {default}"
    return f"Value must be at least {least}" if level < least \
        else f"Value must be no more than {greatest}"


class TopicCodec:
    """The codec a topic stores its batches in (compression.type other than `producer`), with
    its level."""

    __slots__ = ("name", "codec", "level")

    def __init__(self, name: str, level: int | None = None):
        if name not in CODEC_IDS:
            raise ValueError(f"compression.type {name!r} names no codec")
        if level is not None and (name not in LEVELS or level_problem(name, level)):
            raise ValueError(f"{name} has no level {level}")
        self.name, self.codec = name, CODEC_IDS[name]
        self.level = LEVELS[name][2] if level is None and name in LEVELS else level

    def __eq__(self, other) -> bool:
        return isinstance(other, TopicCodec) and (self.codec, self.level) == (other.codec,
                                                                              other.level)

    def __hash__(self) -> int:
        return hash((self.codec, self.level))

    def __repr__(self) -> str:
        return f"TopicCodec({self.name!r}, {self.level})"

    def packer(self) -> "Packer":
        return Packer(self.codec, self.level)


def topic_codec(compression_type: str, levels: dict[str, int]) -> TopicCodec | None:
    """The codec of compression.type (None for `producer`), at its level in `levels`
    (codec name -> the compression.<codec>.level in force)."""
    if compression_type == "producer":
        return None
    return TopicCodec(compression_type, levels.get(compression_type))


class Packer:
    """One batch's records compressed in a codec, fed a slice at a time; `size` is what the
    output holds so far (a batch grown past its bound is refused before it is finished)."""

    def __init__(self, codec: int, level: int | None = None, raw_snappy: bool = False):
        """`raw_snappy`: snappy as one raw block, without snappy-java's framing (what
        librdkafka writes)."""
        self.codec, self.size = codec, 0
        self._out: list[bytes] = []
        if codec == 1:
            self._stream = zlib.compressobj(-1 if level is None else level, zlib.DEFLATED, 31)
        elif codec == 2:
            self._pending, self._raw = bytearray(), raw_snappy
            if not raw_snappy:
                self._emit(_XERIAL_HEADER)
        elif codec == 3:  # block_linked=False: Kafka's Java reader takes independent blocks only
            self._stream = cramjam.lz4.Compressor(
                level=0 if level in (None, _LZ4_FAST) else level, content_checksum=False,
                block_linked=False)
        elif codec == 4:
            self._stream = cramjam.zstd.Compressor(level=3 if level is None else level)
        elif codec != 0:
            raise ValueError(f"no codec {codec}")

    def _emit(self, data) -> None:
        if data:
            self._out.append(data)
            self.size += len(data)

    def feed(self, data) -> None:
        """Compress `data` (bytes or a view, which an uncompressed output keeps until
        `finish`)."""
        codec = self.codec
        if codec == 0:
            self._emit(data)
        elif codec == 1:
            self._emit(self._stream.compress(data))
        elif codec == 2:
            self._pending += data
            if not self._raw:
                self._snappy_blocks(_XERIAL_BLOCK)
        else:  # lz4, zstd (which take bytes only): flushed, so that `size` follows the input
            self._stream.compress(bytes(data))
            self._emit(self._stream.flush())

    def _snappy_blocks(self, least: int) -> None:
        """snappy-java's blocks of the pending input, while `least` bytes are pending."""
        pending, start = self._pending, 0
        with memoryview(pending) as view:  # released before the bytearray shrinks
            while len(pending) - start >= least and len(pending) > start:
                block = cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK])
                self._emit(struct.pack(">i", len(block)))
                self._emit(block)
                start += _XERIAL_BLOCK
        del pending[:start]

    def finish(self) -> list:
        """The whole compressed stream, in pieces (joined by the batch they go into); the
        packer is spent."""
        codec = self.codec
        if codec == 1:
            self._emit(self._stream.flush())
        elif codec == 2 and self._raw:
            self._emit(cramjam.snappy.compress_raw(bytes(self._pending)))
        elif codec == 2:
            self._snappy_blocks(1)
        elif codec in (3, 4):
            self._emit(self._stream.finish())
        out, self._out = self._out, []
        return out


def compress(codec: int, data, level: int | None = None, raw_snappy: bool = False) -> bytes:
    """`data` compressed at once (see Packer)."""
    packer = Packer(codec, level, raw_snappy)
    packer.feed(data)
    return b"".join(packer.finish())
