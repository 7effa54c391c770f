"""A partition's segments as one process holds them: the bases on disk and the open handles.

The bases are listed again only when the state's segments version moves (a roll, a deletion,
a compaction swap, a repair); the handles of segments gone, or perhaps replaced by
compaction, are closed then and opened again at their next use.  The active segment's handle
stays: only appends change it, and they keep its files.
"""

from __future__ import annotations

from broker.shared.log.files import OpenFiles
from broker.shared.log.partition_state import (W_ACTIVE_BASE, W_SEGMENTS_VERSION, W_SWAPS,
                                               StateFile)
from broker.shared.log.segment import Segment, list_bases


class SegmentCache:
    """The segments of the partition in `directory`, opened through `files` (the registry's
    bounded open files) and checked against compaction swaps (see Segment)."""

    def __init__(self, directory: str, files: OpenFiles, state_file: StateFile):
        self.directory = directory
        self._files = files
        self._state = state_file.words
        self._swaps = (self._swap_count, state_file.writer_waited)
        self._open: dict[int, Segment] = {}
        self.bases: list[int] = []  # as of the last refresh
        self._version = -1  # the segments version `bases` were listed at

    def _swap_count(self) -> int:
        return self._state[W_SWAPS]

    def refresh(self) -> None:
        version = self._state[W_SEGMENTS_VERSION]
        if version == self._version:
            return
        bases = list_bases(self.directory)
        active = self._state[W_ACTIVE_BASE]
        for base in list(self._open):
            # Gone (retention), or perhaps replaced (compaction): reopened when next read.
            if base not in bases or base != active:
                self._open.pop(base).close()
        self.bases, self._version = bases, version

    def get(self, base: int, create: bool = False) -> Segment:
        segment = self._open.get(base)
        if segment is None:
            segment = Segment(self.directory, base, self._files, create, self._swaps)
            self._open[base] = segment
        return segment

    def close(self) -> None:
        """Close every handle; the next refresh lists the bases again."""
        for segment in self._open.values():
            segment.close()
        self._open.clear()
        self._version = -1
