"""Windowed rates with Kafka's quota semantics (its Rate, SampledStat and QuotaUtils).

A sensor keeps `samples` windows of `window` seconds.  A new window starts once the current
one is `window` old; windows whose last event is `samples * window` old are forgotten.
The rate is the sum of the kept windows divided by the elapsed time since the oldest one
started, but never by less than `burst_windows * window`: that floor is the initial burst a
fresh sensor allows (Kafka fixes it at `samples - 1` windows, i.e. 10 x the limit with the
defaults; here it is explicit and configurable).

A quota is checked after recording.  When the observed rate O exceeds the limit T, the
throttle time is (O - T) / T * window_size, capped at one window for connection quotas.
"""

from __future__ import annotations

import math


class Rate:
    """Events per second over a sampled window; `now` is in seconds (any monotonic clock)."""

    __slots__ = ("window", "samples", "burst_windows", "_starts", "_counts", "_current")

    def __init__(self, window: float, samples: int, burst_windows: int | None = None):
        if window <= 0 or samples < 1:
            raise ValueError(f"window {window} and samples {samples} must be positive")
        burst = samples - 1 if burst_windows is None else burst_windows
        if not 0 <= burst <= max(0, samples - 1):
            raise ValueError(f"burst windows {burst} must be within 0..{samples - 1}")
        self.window = window
        self.samples = samples
        self.burst_windows = burst
        self._starts = [0.0] * samples
        self._counts = [0.0] * samples
        self._current = -1  # index of the newest window, -1 before the first event

    def record(self, value: float, now: float) -> None:
        if self._current < 0 or now - self._starts[self._current] >= self.window:
            self._current = (self._current + 1) % self.samples
            self._starts[self._current] = now
            self._counts[self._current] = 0.0
        self._counts[self._current] += value

    def measure(self, now: float) -> float:
        if self._current < 0:
            return 0.0
        total, oldest = 0.0, now
        horizon = self.samples * self.window
        for start, count in zip(self._starts, self._counts):
            if count and now - start < horizon:
                total += count
                oldest = min(oldest, start)
        return total / self.window_size(now, oldest)

    def window_size(self, now: float, oldest: float) -> float:
        elapsed = now - oldest
        whole = math.floor(elapsed / self.window)
        if whole < self.burst_windows:
            elapsed += (self.burst_windows - whole) * self.window
        return max(elapsed, 0.001)

    def throttle(self, limit: float, now: float, cap: float | None = None) -> float:
        """Seconds to wait for the rate to fall back to `limit` (0 when within it)."""
        if limit <= 0:
            return self.window if cap is None else cap
        observed = self.measure(now)
        if observed <= limit:
            return 0.0
        oldest = min((start for start, count in zip(self._starts, self._counts) if count),
                     default=now)
        delay = (observed - limit) / limit * self.window_size(now, oldest)
        return delay if cap is None else min(delay, cap)

    def idle_since(self, now: float) -> float:
        """Seconds since the newest window started (for expiring unused sensors)."""
        return now - self._starts[self._current] if self._current >= 0 else math.inf
