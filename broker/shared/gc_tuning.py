"""The cyclic garbage collector's settings for a long-running broker process.

Connections, their buffers and the loop's handles are long-lived and hold almost no reference
cycles, yet with CPython's default thresholds (700, 10, 10) the collector traversed them again
and again: a quarter of a worker's CPU per new connection during a connection burst (measured
with py-spy).  After start-up everything built so far (modules, codecs, config) is frozen out of
the collector's reach, and a young generation of 10,000 objects makes collections rarer; the
little cyclic garbage there is still goes, a little later.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def tune_after_start() -> None:
    """Call once a process has built its long-lived state."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
