"""What a broker process declares before it imports the Kafka protocol library (kio).

kio registers a hypothesis strategy for each of its string and number types whenever
hypothesis can be imported, and hypothesis is installed wherever this project's tests run:
importing it and building those strategies cost each broker and worker process 0.1 to 0.16 s
of CPU at start (measured: 1.21 -> 1.11 s for a worker's imports and request schemas, more
where hypothesis has no cache in the working directory), for nothing a broker uses.
"""

from __future__ import annotations

import sys


def without_test_strategies() -> None:
    """Call first in a process's entry point: hypothesis, if not imported yet, is declared
    absent, so kio skips its registrations (an import of it raises ImportError)."""
    sys.modules.setdefault("hypothesis", None)
