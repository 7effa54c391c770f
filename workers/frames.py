"""The pipelined fast path: a read's request frames answered straight from the memo of pure
answers (workers.router.Router.memo), before any frame becomes a request object.

    answer_memoized(data, offset, max_bytes, memo, out, handled[, end]) -> offset

walks the complete frames of `data` (only its first `end` bytes when `end` is given: a read
into a larger buffer is walked where it lies) from `offset` (a 4-byte big-endian size, then
that many bytes) while each one's key is in `memo`: the key is the frame without its size
and without its correlation id (api key, api version, then all after the correlation id),
the value a tuple (head, tail, api key), the answer head + the request's correlation id +
tail.  The answers of one call join in one bytes object appended to `out` (none: nothing
appended), the api key of each answered request is appended to `handled`, and it returns the
offset of the first frame it left: fewer than 4 bytes, a size below 8 or above `max_bytes` or
above MAX_KEY_BYTES + 4, an incomplete frame, a key not memoized, or MAX_ANSWERS answered
already.  The caller serves that frame its usual way and may call again after it.

The walk is in C (workers/_frames.c, built by `pip install -e .`); `python_answer_memoized`
is the same walk in Python, the oracle the tests and the fuzz target compare it with, and
what runs where the C one is not built.
"""

from __future__ import annotations

import struct

MAX_KEY_BYTES = 260  # route (api key, version) + at most 256 bytes after the correlation id
MAX_ANSWERS = 256  # per call

_SIZE = struct.Struct(">i")
_MISSING = object()


def python_answer_memoized(data, offset: int, max_bytes: int, memo: dict, out: list,
                           handled: list, end: int | None = None) -> int:
    """The walk, in Python (see the module's docstring)."""
    if offset < 0:
        raise ValueError("a negative offset")
    if end is not None and end < 0:
        raise ValueError("a negative end")
    if type(memo) is not dict or not isinstance(out, list) or not isinstance(handled, list):
        raise TypeError("memo is a dict, out and handled are lists")
    view = memoryview(data).cast("B") if type(data) is not bytes else data
    end = len(view) if end is None else min(end, len(view))
    answers, keys = [], []
    while len(keys) < MAX_ANSWERS and end - offset >= 4:
        size = _SIZE.unpack_from(view, offset)[0]
        if size < 8 or size > max_bytes or size > MAX_KEY_BYTES + 4 or end - offset - 4 < size:
            break
        value = memo.get(bytes(view[offset + 4:offset + 8]) + view[offset + 12:offset + 4 + size],
                          _MISSING)
        if value is _MISSING:
            break
        if not (type(value) is tuple and len(value) == 3 and isinstance(value[0], bytes)
                and isinstance(value[1], bytes)):
            raise TypeError("a memoized answer is a tuple (head, tail, api key)")
        answers += (value[0], view[offset + 8:offset + 12], value[1])
        keys.append(value[2])
        offset += 4 + size
    if keys:
        out.append(b"".join(answers))
        handled.extend(keys)
    return offset


try:  # the same walk in C, built by `pip install -e .`
    from workers import _frames
except ImportError:
    _frames = None
answer_memoized = python_answer_memoized if _frames is None else _frames.answer_memoized
