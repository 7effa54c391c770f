"""Anonymous mappings for large request frames, kept by one worker for reuse.

A fresh mapping costs a page fault and a zeroed page per 4 KiB as the bytes land in it: about
0.4 ms per MB on this machine (measured), as much as the rest of receiving a produce
request.  So mappings whose frame was served are kept, up to `keep_bytes` per worker, in size
classes (powers of two from MAPPED_FRAME_BYTES), and handed out again.  A kept mapping is only
reused once no view of its last frame is alive (a Produce whose batch is walked over several
loop turns still holds one); the one way mmap tells is by refusing to resize, so that is the
test (a resize to its own size, which moves nothing).
"""

from __future__ import annotations

import mmap

_MAP_NORESERVE = 0x4000  # Linux: no swap reserved up front (the mmap module does not name it)
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE


def new_mapping(size: int) -> mmap.mmap:
    """Memory the kernel gives page by page as it is written, never the size up front."""
    return mmap.mmap(-1, size, flags=_FLAGS)


def _size_class(size: int, smallest: int) -> int:
    span = smallest
    while span < size:
        span *= 2
    return span


def _unviewed(mapping: mmap.mmap) -> bool:
    try:
        mapping.resize(len(mapping))
    except BufferError:  # a view of its last frame is still alive
        return False
    return True


class FrameMaps:
    """Mappings for frames above `smallest` bytes; at most `keep_bytes` kept while unused."""

    def __init__(self, smallest: int, keep_bytes: int):
        if smallest <= 0 or keep_bytes < 0:
            raise ValueError(f"bad frame mapping bounds: smallest {smallest}, keep {keep_bytes}")
        self.smallest = smallest
        self.keep_bytes = keep_bytes
        self.kept_bytes = 0
        self._kept: dict[int, list[mmap.mmap]] = {}  # size class -> mappings given back
        self.reused = self.created = 0

    def take(self, size: int) -> mmap.mmap:
        """A mapping of at least `size` bytes (its first `size` are the frame's); OSError if
        the kernel refuses a new one."""
        span = _size_class(size, self.smallest)
        kept = self._kept.get(span)
        if kept:
            for index, mapping in enumerate(kept):
                if _unviewed(mapping):
                    del kept[index]
                    self.kept_bytes -= span
                    self.reused += 1
                    return mapping
        self.created += 1
        return new_mapping(span)

    def give_back(self, mapping: mmap.mmap) -> None:
        """The frame read into `mapping` was served (its views may live a little longer)."""
        span = len(mapping)
        if self.kept_bytes + span > self.keep_bytes:
            return  # dropped: unmapped once its last view is gone
        self._kept.setdefault(span, []).append(mapping)
        self.kept_bytes += span
