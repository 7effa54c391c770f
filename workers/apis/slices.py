"""Requests served a slice per event-loop turn, so that one request over many partitions never
holds the worker (and every other client on it) for long.

A handler writes its work as a generator that does one piece (a partition) per step and
yields what the step cost; `in_slices` runs steps until a turn's budget is spent, then lets
the loop serve others before going on, and answers with `finish()` once the steps are done.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Iterator


def in_slices(steps: Iterator[int], budget: int, finish: Callable[[], bytes]):
    """`finish()` at once if the steps fit one turn's `budget` (or no loop runs: in-process
    use), else a Future of it.  A connection that goes away meanwhile (the Future done)
    stops the steps: the generator is closed."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if _advance(steps, budget if loop is not None else None):
        return finish()
    future = loop.create_future()
    loop.call_soon(_next_slice, loop, steps, budget, finish, future)
    return future


def _advance(steps: Iterator[int], budget: int | None) -> bool:
    """Run steps until `budget` (None: no bound) is spent; True when none is left."""
    spent = 0
    for cost in steps:
        spent += cost
        if budget is not None and spent >= budget:
            return False
    return True


def _next_slice(loop, steps: Iterator[int], budget: int, finish, future) -> None:
    if future.done():
        steps.close()
        return
    try:
        if not _advance(steps, budget):
            loop.call_soon(_next_slice, loop, steps, budget, finish, future)
            return
        future.set_result(finish())
    except Exception as error:  # noqa: BLE001 - the connection fails it (logged, closed)
        future.set_exception(error)
