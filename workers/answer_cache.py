"""A cache of encoded answers, bounded in bytes whatever its keys: what clients choose (a
request's bytes, the topics it names) can never make it grow past its budget.

Keys larger than `max_key_bytes` are not cached at all (their requests are answered afresh);
values larger than a quarter of the budget neither.  When an entry would overflow the budget,
the oldest entries go first.

The entries are a plain dict, `table` (key -> value), which a reader may look up directly (the
worker's C frame walk does); the cost of each entry is kept beside it, in the same order.
"""

from __future__ import annotations


class BoundedCache:
    def __init__(self, max_bytes: int, max_key_bytes: int):
        if max_bytes <= 0 or max_key_bytes <= 0:
            raise ValueError("a cache needs a positive budget")
        self.max_bytes = max_bytes
        self.max_key_bytes = max_key_bytes
        self.bytes = 0
        self.table: dict = {}  # key -> value, oldest first: read it, never write it
        self._costs: dict = {}  # key -> cost, in the order of `table`

    def __len__(self) -> int:
        return len(self.table)

    def get(self, key):
        return self.table.get(key)

    def put(self, key, value, key_bytes: int, value_bytes: int) -> None:
        """Keep `value` unless the key or the value is too large to be worth it."""
        cost = key_bytes + value_bytes
        if key_bytes > self.max_key_bytes or cost > self.max_bytes // 4:
            return
        old = self._costs.pop(key, None)
        if old is not None:
            del self.table[key]
            self.bytes -= old
        while self._costs and self.bytes + cost > self.max_bytes:
            oldest = next(iter(self._costs))
            del self.table[oldest]
            self.bytes -= self._costs.pop(oldest)
        self.table[key] = value
        self._costs[key] = cost
        self.bytes += cost

    def clear(self) -> None:
        self.table.clear()
        self._costs.clear()
        self.bytes = 0
