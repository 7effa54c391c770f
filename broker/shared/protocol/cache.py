"""A cache of encoded answers, bounded in bytes whatever its keys: what clients choose (a
request's bytes, the topics it names) can never make it grow past its budget.

Keys larger than `max_key_bytes` are not cached at all (their requests are answered afresh);
values larger than a quarter of the budget neither.  When an entry would overflow the budget,
the oldest entries go first.
"""

from __future__ import annotations


class BoundedCache:
    def __init__(self, max_bytes: int, max_key_bytes: int):
        if max_bytes <= 0 or max_key_bytes <= 0:
            raise ValueError("a cache needs a positive budget")
        self.max_bytes = max_bytes
        self.max_key_bytes = max_key_bytes
        self.bytes = 0
        self._entries: dict = {}  # key -> (value, cost), oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key):
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key, value, key_bytes: int, value_bytes: int) -> None:
        """Keep `value` unless the key or the value is too large to be worth it."""
        cost = key_bytes + value_bytes
        if key_bytes > self.max_key_bytes or cost > self.max_bytes // 4:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        while self._entries and self.bytes + cost > self.max_bytes:
            self.bytes -= self._entries.pop(next(iter(self._entries)))[1]
        self._entries[key] = (value, cost)
        self.bytes += cost

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
