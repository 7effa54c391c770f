"""Client quotas inside a worker: which throttle a request earns (KIP-219).

The quota values come from the parent (IPC `Quotas`) and the static defaults; the sensors are
broker-wide token buckets (broker.shared.client_quotas.QuotaSensors over the shared block).
What is charged comes with the handler's answer (workers.answer): Produce the request's size,
as Kafka, after the append; Fetch the bytes it returns (a client that already `owes` quota
time is answered empty, without reading data that would be thrown away); every request its
handling time.  The router (workers.router) asks what the request `earned` and applies it.
Every throttle is capped by `pybroker.quota.max.throttle.ms`; client ids in
`pybroker.quota.exempt.client.ids` are never throttled.
"""

from __future__ import annotations

import logging
import time

from broker.shared.client_quotas import (FETCH, PRODUCE, QUOTA_KEYS, REQUEST,
                                         QuotaSensors, quota_in_force)
from broker.shared.config import ServerProperties

log = logging.getLogger("workers.throttling")

LOG_EVERY_SECONDS = 1.0
# Sensors count whole numbers: request time is counted in millionths of a percent-second.
UNITS = {PRODUCE: 1, FETCH: 1, REQUEST: 1_000_000}


class ClientQuotas:
    def __init__(self, props: ServerProperties, sensors: QuotaSensors, stats, events=None):
        self.sensors = sensors
        self.stats = stats
        self.events = events  # workers.worker_events.WorkerEvents, or None
        self.entries: dict[str, dict[str, float]] = {}
        self.static = {key: value for key, value in (
            ("producer_byte_rate", props.quota_producer_default),
            ("consumer_byte_rate", props.quota_consumer_default),
            ("request_percentage", props.pybroker_quota_request_percentage_default))
            if value is not None}
        self.cap = props.pybroker_quota_max_throttle_ms / 1000
        self.exempt = {item.strip() for item in props.pybroker_quota_exempt_client_ids.split(",")
                       if item.strip()}
        self._in_force: dict[tuple[int, str], tuple[float, int] | None] = {}
        self._last_log: dict[str, float] = {}
        self._last_full_log = 0.0
        self.shadow = props.pybroker_shadow_client_quotas  # observe only: nothing throttled

    def update(self, entries: dict[str, dict[str, float]], shadow: bool = False) -> None:
        self.entries = entries
        self.shadow = shadow
        self._in_force.clear()

    def active(self) -> bool:
        return bool(self.entries or self.static)

    def _quota(self, quota: int, user: str, client_id: str | None) -> tuple[float, int] | None:
        """(limit, sensor) of the user's and client's quota; None if unlimited (or, the sensor
        table being full, not tracked for now)."""
        client = client_id or ""
        found = self._in_force.get((quota, user, client), False)
        if found is False:
            found = None
            if client not in self.exempt:
                match = quota_in_force(self.entries, self.static, user, client, QUOTA_KEYS[quota])
                if match is not None:
                    found = (match[0] * UNITS[quota], match[1])
            if len(self._in_force) > 10000:
                self._in_force.clear()
            self._in_force[(quota, user, client)] = found
        if found is None:
            return None
        entity = self.sensors.entity(found[1])  # a sensor may be taken over after idling
        if entity is None:
            self._untracked(client_id)
            return None
        return found[0], entity

    def _untracked(self, client_id: str | None) -> None:
        self.stats.quota_untracked()
        now = time.monotonic()
        if now - self._last_full_log >= LOG_EVERY_SECONDS:
            self._last_full_log = now
            log.warning("every quota sensor (pybroker.quota.max.sensors) is in use: client-id=%s "
                        "is not held to its quota until one frees up", client_id)

    def record(self, quota: int, user: str, client_id: str | None, amount: float) -> float:
        """Count `amount` for the user and client; return the throttle (seconds) earned."""
        found = self._quota(quota, user, client_id)
        if found is None:
            return 0.0
        limit, entity = found
        return self._throttle(quota, self.sensors.charge(quota, entity, amount, limit), user,
                              client_id)

    def earned(self, user: str, client_id: str | None, busy: float,
               quota: int | None = None, amount: int = 0) -> float:
        """The throttle (seconds) a request earns: its handling time (`busy` seconds) charged
        to request_percentage (percent of one worker's time) and, for Produce and Fetch, its
        bytes to their quota; the longer of the two, as Kafka throttles."""
        seconds = 0.0
        if busy > 0:
            seconds = self.record(REQUEST, user, client_id, busy * 100 * UNITS[REQUEST])
        if quota is not None:
            seconds = max(seconds, self.record(quota, user, client_id, amount))
        return seconds

    def owes(self, quota: int, user: str, client_id: str | None) -> float:
        """The seconds of throttle the client already owes (a fetch then reads nothing),
        capped as every throttle is; always 0 in shadow mode, where nothing is throttled."""
        if self.shadow:
            return 0.0
        found = self._quota(quota, user, client_id)
        return 0.0 if found is None else min(self.sensors.owed(quota, found[1]), self.cap)

    def _throttle(self, quota: int, owed: float, user: str, client_id: str | None) -> float:
        """The throttle of a client owing `owed` seconds of quota: capped, counted, logged,
        and 0 in shadow mode."""
        seconds = min(owed, self.cap)
        if seconds > 0:
            shadow = self.shadow
            self.stats.throttled(quota, seconds, dry_run=shadow)
            if self.events is not None:
                self.events.throttled(QUOTA_KEYS[quota], client_id, seconds, user, shadow)
            self._tell(quota, user, client_id, seconds)
            if shadow:  # shadow mode: counted and logged as a dry run, not applied
                return 0.0
        return seconds

    def _tell(self, quota: int, user: str, client_id: str | None, seconds: float) -> None:
        """Who is being throttled: one log line per client and quota per second at most."""
        key = f"{quota}/{user}/{client_id}"
        now = time.monotonic()
        if now - self._last_log.get(key, 0.0) >= LOG_EVERY_SECONDS:
            if len(self._last_log) > 10000:
                self._last_log.clear()
            self._last_log[key] = now
            log.info("%s client-id=%s quota=%s throttle_ms=%d user=%s",
                     "would throttle (shadow mode)" if self.shadow else "throttled", client_id,
                     QUOTA_KEYS[quota], seconds * 1000, user)


__all__ = ["ClientQuotas", "FETCH", "PRODUCE"]
