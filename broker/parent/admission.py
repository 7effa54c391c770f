"""Connection admission in the parent (KIP-402 counts, KIP-612 creation rates).

`ConnectionQuotas` is the single authority on how many connections are open: the acceptors
ask it before and after each accept, workers report closes (IPC `Closed`), and the supervisor
releases everything a dead worker held.  It never blocks; it answers with numbers and
decisions the acceptor acts on:

  room(listener)      sockets this listener may accept now (listener limit, and broker limit
                      unless the listener is protected)
  admit(...)          per-IP count, then per-IP rate, then the broker and listener rates:
                        REJECT (close at once, per_ip_limit), THROTTLE_IP (hold the socket
                        unread and close it after the delay, per_ip_rate), or ADMIT with the
                        time the listener's acceptor must pause for the listener/broker rate
  excess()            connections over max.connections (to evict, after a protected listener
                      went over it or the limit was lowered)
  claim_user(...)     once a connection authenticated (its worker asks before answering): the
                      principal's count, then its rate: REJECT_USER_LIMIT (per_user_limit),
                      THROTTLE_USER (per_user_rate) or ADMIT, counted from then on

Shadow mode: a limit family named in `Limits.shadow` (SHADOW_FAMILIES) observes
only.  Its connections are admitted, and what would have been done is named in the
decision's `would` (the acceptor counts it as a dry-run rejection and logs it), so an operator
sizes a limit on real traffic before enforcing it.

Unlike Kafka, a connection refused for its IP is not charged to the broker and listener
rates, and per-IP count rejections happen before any rate is touched.  The protected
(inter-broker) listener, when there is more than one data listener, may exceed max.connections
and is exempt from the broker-wide rate (not from its own).

The control-plane listener (KIP-291), when there is one, is outside the data plane's limits
altogether: its connections are not counted in max.connections or per IP, are not charged to
the broker rate and are never evicted; only its own listener limits apply to it.  An operator
connecting from an address a storm exhausted can still get in.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import Enum

from broker.parent.rates import Rate
from broker.shared.constants import INT_MAX
from broker.shared.overrides import address_of

SENSOR_EXPIRY = 3600.0  # an unused per-IP or per-user rate sensor is dropped after an hour, as Kafka


# Limit families that can be set to observe only (pybroker.shadow.<family>), and the dry-run
# reasons each gives (shm.block.DRY_RUN_REASONS counts them).
SHADOW_FAMILIES = {"max.connections": ("max_connections",),
                   "connections.per.ip": ("per_ip_limit",),
                   "connections.per.user": ("per_user_limit",),
                   "connection.creation.rate": ("per_ip_rate", "creation_rate",
                                                "per_user_rate")}


class Verdict(Enum):
    ADMIT = "admit"
    REJECT_IP_LIMIT = "per_ip_limit"
    THROTTLE_IP = "per_ip_rate"
    REJECT_USER_LIMIT = "per_user_limit"
    THROTTLE_USER = "per_user_rate"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay: float = 0.0  # THROTTLE_IP: close after; ADMIT: pause the acceptor for
    would: tuple[str, ...] = ()  # dry-run reasons: what a shadowed family would have done


# The common verdict, shared: one Decision fewer to build per accepted socket.
ADMITTED = Decision(Verdict.ADMIT)


@dataclass(frozen=True)
class Limits:
    """The connection limits in force (static config overlaid with dynamic changes)."""

    max_connections: int = INT_MAX
    listener_max_connections: dict[int, int] = field(default_factory=dict)
    max_connections_per_ip: int = INT_MAX
    ip_overrides: tuple[tuple[ipaddress._BaseNetwork, int], ...] = ()  # most specific first
    max_connection_creation_rate: int = INT_MAX
    listener_creation_rate: dict[int, int] = field(default_factory=dict)
    ip_creation_rate_default: int = INT_MAX
    ip_creation_rates: dict[str, int] = field(default_factory=dict)
    max_connections_per_user: int = INT_MAX
    user_overrides: dict[str, int] = field(default_factory=dict)
    user_creation_rate: int = INT_MAX
    user_rate_overrides: dict[str, int] = field(default_factory=dict)
    shadow: frozenset[str] = frozenset()  # SHADOW_FAMILIES observing only

    def listener_max(self, listener: int) -> int:
        return self.listener_max_connections.get(listener, INT_MAX)

    def per_ip_limit(self, ip: str) -> int:
        if not self.ip_overrides:
            return self.max_connections_per_ip  # spares parsing the address per connection
        address = address_of(ip)
        if address is not None:
            for network, limit in self.ip_overrides:
                if address in network:
                    return limit
        return self.max_connections_per_ip

    def ip_rate(self, ip: str) -> int:
        return self.ip_creation_rates.get(ip, self.ip_creation_rate_default)

    def per_user_limit(self, user: str) -> int:
        return self.user_overrides.get(user, self.max_connections_per_user)

    def user_rate(self, user: str) -> int:
        return self.user_rate_overrides.get(user, self.user_creation_rate)


class ConnectionQuotas:
    """Counts and rate sensors of the parent; `now` is time.monotonic() seconds."""

    def __init__(self, listeners: int, protected: int | None, limits: Limits,
                 window: float = 1.0, samples: int = 11, burst_windows: int | None = None,
                 control_plane: int | None = None):
        self.listeners = listeners
        self.protected = protected  # listener index exempt from max.connections, or None
        self.control_plane = control_plane  # listener index outside the data plane, or None
        self.limits = limits
        self._window, self._samples, self._burst = window, samples, burst_windows
        self.total = 0
        self.per_listener = [0] * listeners
        self.per_ip: dict[str, int] = {}
        self._owners: dict[int, tuple[int, str]] = {}  # conn id -> (listener, ip)
        self._broker_rate = self._sensor()
        self._listener_rates = [self._sensor() for _ in range(listeners)]
        self._ip_rates: dict[str, Rate] = {}
        self.per_user: dict[str, int] = {}  # principal name -> authenticated connections
        self._users: dict[int, str] = {}  # conn id -> the principal it was counted for
        self._user_rates: dict[str, Rate] = {}

    def _sensor(self) -> Rate:
        return Rate(self._window, self._samples, self._burst)

    # --- slots ----------------------------------------------------------------------------

    def room(self, listener: int) -> int:
        """How many more connections this listener may have right now."""
        if "max.connections" in self.limits.shadow and listener != self.control_plane:
            return INT_MAX  # observed only: `admit` names what would have been blocked
        free = self.limits.listener_max(listener) - self.per_listener[listener]
        if listener != self.protected and listener != self.control_plane:
            free = min(free, self.limits.max_connections - self.total)
        return max(0, free)

    def excess(self) -> int:
        if "max.connections" in self.limits.shadow:
            return 0
        return max(0, self.total - self.limits.max_connections)

    # --- admission ------------------------------------------------------------------------

    def admit(self, listener: int, ip: str, now: float) -> Decision:
        """Judge one accepted socket; on ADMIT the caller must call `opened` for it."""
        if listener == self.control_plane:
            delay = self._charge_rates(listener, now)
            return Decision(Verdict.ADMIT, delay) if delay else ADMITTED
        shadow, would = self.limits.shadow, []
        if self.per_ip.get(ip, 0) >= self.limits.per_ip_limit(ip):
            if "connections.per.ip" not in shadow:
                return Decision(Verdict.REJECT_IP_LIMIT)
            would.append("per_ip_limit")
        rates_shadowed = "connection.creation.rate" in shadow
        delay = self._over_rate(self._ip_rates, ip, self.limits.ip_rate(ip), now,
                                keep=rates_shadowed)
        if delay > 0:
            if not rates_shadowed:
                return Decision(Verdict.THROTTLE_IP, delay)
            would.append("per_ip_rate")
        if "max.connections" in shadow and self._over_max(listener):
            would.append("max_connections")
        delay = self._charge_rates(listener, now)
        if delay > 0 and rates_shadowed:
            would.append("creation_rate")
            delay = 0.0
        if delay or would:
            return Decision(Verdict.ADMIT, delay, tuple(would))
        return ADMITTED

    def _over_max(self, listener: int) -> bool:
        """Whether one more connection would pass the listener's or the broker's limit."""
        if self.per_listener[listener] >= self.limits.listener_max(listener):
            return True
        return listener != self.protected and self.total >= self.limits.max_connections

    def _over_rate(self, sensors: dict[str, Rate], key: str, limit: int, now: float,
                   keep: bool = False) -> float:
        """Charge one connection to `key`'s sensor; if that puts it over `limit`, take the
        charge back (a refused connection is not charged; `keep`: it is admitted all the
        same, in shadow mode) and return the throttle delay."""
        if limit >= INT_MAX:
            return 0.0
        sensor = sensors.get(key)
        if sensor is None:
            sensor = sensors[key] = self._sensor()
        sensor.record(1, now)
        delay = sensor.throttle(limit, now, cap=self._window)
        if delay > 0 and not keep:
            sensor.record(-1, now)
        return delay

    def _charge_rates(self, listener: int, now: float) -> float:
        delay = 0.0
        sensor = self._listener_rates[listener]
        sensor.record(1, now)
        limit = self.limits.listener_creation_rate.get(listener, INT_MAX)
        if limit < INT_MAX:
            delay = sensor.throttle(limit, now, cap=self._window)
        if listener != self.protected and listener != self.control_plane:
            self._broker_rate.record(1, now)
            if self.limits.max_connection_creation_rate < INT_MAX:
                delay = max(delay, self._broker_rate.throttle(
                    self.limits.max_connection_creation_rate, now, cap=self._window))
        return delay

    def opened(self, conn_id: int, listener: int, ip: str) -> None:
        self._owners[conn_id] = (listener, ip)
        self.per_listener[listener] += 1
        if listener != self.control_plane:
            self.total += 1
            self.per_ip[ip] = self.per_ip.get(ip, 0) + 1

    def closed(self, conn_id: int) -> tuple[int, str] | None:
        """Release a connection's slots; None if it was unknown (already released)."""
        owner = self._owners.pop(conn_id, None)
        if owner is None:
            return None
        listener, ip = owner
        self.per_listener[listener] -= 1
        if self._users:
            self._release_user(conn_id)
        if listener == self.control_plane:
            return owner
        self.total -= 1
        _decrement(self.per_ip, ip)
        return owner

    def claim_user(self, conn_id: int, user: str, now: float) -> Decision:
        """A connection authenticated as `user`: may it stay?  On ADMIT it counts for the user
        until `closed`.  A connection already gone, already counted, or on the control plane
        (outside the data plane's limits) is admitted without counting."""
        owner = self._owners.get(conn_id)
        if owner is None or owner[0] == self.control_plane or conn_id in self._users:
            return Decision(Verdict.ADMIT)
        shadow, would = self.limits.shadow, []
        if self.per_user.get(user, 0) >= self.limits.per_user_limit(user):
            if "connections.per.user" not in shadow:
                return Decision(Verdict.REJECT_USER_LIMIT)
            would.append("per_user_limit")
        rates_shadowed = "connection.creation.rate" in shadow
        if self._over_rate(self._user_rates, user, self.limits.user_rate(user), now,
                           keep=rates_shadowed) > 0:
            if not rates_shadowed:
                return Decision(Verdict.THROTTLE_USER)
            would.append("per_user_rate")
        self._users[conn_id] = user
        self.per_user[user] = self.per_user.get(user, 0) + 1
        return Decision(Verdict.ADMIT, would=tuple(would))

    def _release_user(self, conn_id: int) -> None:
        user = self._users.pop(conn_id, None)
        if user is not None:
            _decrement(self.per_user, user)

    def owner(self, conn_id: int) -> tuple[int, str] | None:
        return self._owners.get(conn_id)

    # --- reporting ------------------------------------------------------------------------

    def listener_rate(self, listener: int, now: float) -> float:
        return self._listener_rates[listener].measure(now)

    def broker_rate(self, now: float) -> float:
        return self._broker_rate.measure(now)

    def tracked_ips(self) -> int:
        """How many per-IP rate sensors are kept."""
        return len(self._ip_rates)

    def tracked_users(self) -> int:
        """How many per-user rate sensors are kept."""
        return len(self._user_rates)

    def expire_rate_sensors(self, now: float) -> None:
        """Drop the per-IP and per-user rate sensors unused for an hour."""
        for sensors in (self._ip_rates, self._user_rates):
            for key in [key for key, s in sensors.items() if s.idle_since(now) > SENSOR_EXPIRY]:
                del sensors[key]


def _decrement(counts: dict[str, int], key: str) -> None:
    """One fewer for `key`; a key at zero is dropped, so the dict holds only what is open."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
