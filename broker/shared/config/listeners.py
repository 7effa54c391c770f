"""The listeners, and what is set per listener apart from TLS and SASL (those: security.py).

`listeners` and `advertised.listeners` (NAME://host:port), each listener's security protocol
from `listener.security.protocol.map`, which listener is the inter-broker one and which the
control plane (KIP-291), which sit behind a PROXY protocol balancer, the limits set as
`listener.name.<l>.<key>`, and each listener's part of the memory pool.

Reads the system in two places: the CPUs this process may run on (`pybroker.control.plane.cpu`
must be one of them) and, in `listen_backlog`, /proc/sys/net/core/somaxconn.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket

import msgspec

from broker.shared.config.keys import MIB, ConfigError, ServerProperties
from broker.shared.config.properties import split_csv
from broker.shared.constants import INT_MAX
from broker.shared.tls import TLS_KEYS


class Listener(msgspec.Struct, frozen=True):
    """One NAME://host:port entry of `listeners` or `advertised.listeners`."""

    name: str
    host: str
    port: int
    protocol: str = "PLAINTEXT"

    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def family(self) -> int:
        """AF_INET6 for an IPv6 literal, else AF_INET (an empty host binds 0.0.0.0)."""
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET


# Keys that may also be given per listener as listener.name.<lowercase name>.<key>.
LISTENER_KEYS = ("max.connections", "max.connection.creation.rate")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Both matched whole (fullmatch): "$" would also match before a trailing newline.
_LISTENER_KEY = re.compile(r"listener\.name\.([A-Za-z0-9_]+)\.(.+)")
_LISTENER_RE = re.compile(r"([A-Za-z0-9_]+)://\[?([0-9a-zA-Z\-%._:]*?)\]?:(-?[0-9]+)")


def parse_protocol_map(value: str) -> dict[str, str]:
    """listener.security.protocol.map as {LISTENER: PROTOCOL}, both upper-cased."""
    result = {}
    for item in split_csv(value):
        name, sep, protocol = item.partition(":")
        if not sep or not name or not protocol:
            raise ConfigError(f"listener.security.protocol.map: invalid entry {item!r} "
                              "(expected LISTENER:PROTOCOL)")
        if protocol.upper() not in SECURITY_PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: unknown security protocol "
                              f"{protocol!r} for listener {name}")
        if name.upper() in result:
            raise ConfigError(f"listener.security.protocol.map: listener {name} appears twice")
        result[name.upper()] = protocol.upper()
    return result


def parse_listeners(key: str, value: str, protocols: dict[str, str]) -> tuple[Listener, ...]:
    """The NAME://host:port entries of `key`, each with its protocol from the map."""
    listeners: list[Listener] = []
    for item in split_csv(value):
        match = _LISTENER_RE.fullmatch(item)
        if match is None:
            raise ConfigError(f"{key}: invalid listener {item!r} (expected NAME://host:port)")
        name, host, port = match.group(1).upper(), match.group(2), int(match.group(3))
        if not 0 <= port <= 65535:
            raise ConfigError(f"{key}: port {port} of listener {name} is out of range 0-65535")
        protocol = protocols.get(name)
        if protocol is None:
            raise ConfigError(f"{key}: no security protocol for listener {name} in "
                              "listener.security.protocol.map")
        if any(existing.name == name for existing in listeners):
            raise ConfigError(f"{key}: listener name {name} appears more than once")
        listeners.append(Listener(name=name, host=host, port=port, protocol=protocol))
    if not listeners:
        raise ConfigError(f"{key}: at least one listener is required")
    return tuple(listeners)


def check_distinct_ports(listeners: tuple[Listener, ...]) -> None:
    """Two listeners on one port fail (port 0, an ephemeral port each, excepted)."""
    seen: dict[int, str] = {}
    for listener in listeners:
        if listener.port and listener.port in seen:
            raise ConfigError(f"listeners: {listener.name} and {seen[listener.port]} share "
                              f"port {listener.port}; each listener needs its own port")
        seen[listener.port] = listener.name


def advertised_listeners(props: ServerProperties, listeners, protocols) -> tuple[Listener, ...]:
    """advertised.listeners, each one a listener's, none on a wildcard address; else `listeners`."""
    if not props.advertised_listeners:
        return listeners
    advertised = parse_listeners("advertised.listeners", props.advertised_listeners, protocols)
    names = {listener.name for listener in listeners}
    for listener in advertised:
        if listener.name not in names:
            raise ConfigError(f"advertised.listeners: listener {listener.name} is not in "
                              "listeners")
        if listener.host in ("0.0.0.0", "::"):
            raise ConfigError(f"advertised.listeners: {listener.name} advertises the "
                              f"non-routable address {listener.host}")
    return advertised


def inter_broker_listener(props: ServerProperties, listeners) -> str:
    """inter.broker.listener.name, else PLAINTEXT, else the first data listener."""
    names = [listener.name for listener in listeners]
    wanted = props.inter_broker_listener_name.upper()
    if wanted:
        if wanted not in names:
            raise ConfigError(f"inter.broker.listener.name: {wanted} is not a listener in "
                              f"listeners ({', '.join(names)})")
        return wanted
    control = props.control_plane_listener_name.upper()
    data = [name for name in names if name != control] or names
    return "PLAINTEXT" if "PLAINTEXT" in data else data[0]


def control_plane_listener(props: ServerProperties, protocols: dict[str, str], listeners,
                           advertised, inter_broker: str) -> str | None:
    """KIP-291's checks on control.plane.listener.name; None when it is unset."""
    key, name = "control.plane.listener.name", props.control_plane_listener_name.upper()
    if not name:
        if props.pybroker_control_plane_cpu is not None:
            raise ConfigError("pybroker.control.plane.cpu: set, but control.plane.listener.name "
                              "is not")
        return None
    if name not in protocols:
        raise ConfigError(f"{key}: {name} has no security protocol in "
                          "listener.security.protocol.map")
    names = [listener.name for listener in listeners]
    if name not in names:
        raise ConfigError(f"{key}: {name} is not a listener in listeners ({', '.join(names)})")
    if name not in {listener.name for listener in advertised}:
        raise ConfigError(f"{key}: {name} is not in advertised.listeners")
    if len(names) == 1:
        raise ConfigError(f"{key}: {name} is the only listener; clients need a data-plane "
                          "listener too")
    if name == inter_broker:
        raise ConfigError(f"{key}: {name} must differ from inter.broker.listener.name")
    _check_cpu(props.pybroker_control_plane_cpu)
    return name


def _check_cpu(cpu: int | None) -> None:
    if cpu is None:
        return
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        raise ConfigError(f"pybroker.control.plane.cpu: CPU {cpu} is not available to this "
                          f"process (allowed: {','.join(map(str, sorted(allowed)))})")


def split_listener_keys(raw: dict[str, str]):
    """(broker-wide keys, per listener limits, per listener TLS and SASL keys)."""
    plain, per_listener, tls = {}, {}, {}
    for key, value in raw.items():
        match = _LISTENER_KEY.fullmatch(key)
        if match is None:
            plain[key] = value
            continue
        name, suffix = match.group(1).upper(), match.group(2)
        if suffix in TLS_KEYS or suffix == "sasl.enabled.mechanisms" or \
                suffix.endswith(".sasl.jaas.config"):
            tls.setdefault(name, {})[suffix] = value
            continue
        if suffix not in LISTENER_KEYS:
            raise ConfigError(f"{key}: {suffix} cannot be set per listener "
                              f"(only {', '.join(LISTENER_KEYS)} and ssl.*)")
        per_listener.setdefault(name, {})[suffix] = value
    return plain, per_listener, tls


def listener_limits(per_listener: dict[str, dict[str, str]], listeners) -> dict:
    """The listener.name.<l>.<key> limits as {LISTENER: {key: int}}."""
    names = {listener.name for listener in listeners}
    result: dict[str, dict[str, int]] = {}
    for name, values in per_listener.items():
        for suffix, value in values.items():
            key = f"listener.name.{name.lower()}.{suffix}"
            if name not in names:
                raise ConfigError(f"{key}: listener {name} is not in listeners")
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(f"{key}: invalid value {value!r} (expected int)") from None
            if not 0 <= number <= INT_MAX:
                raise ConfigError(f"{key}: invalid value {value!r} (expected int >= 0)")
            result.setdefault(name, {})[suffix] = number
    return result


def listen_backlog(props: ServerProperties, somaxconn: str = "/proc/sys/net/core/somaxconn") -> int:
    """socket.listen.backlog.size, or min(somaxconn, 4096) when it is not set (the kernel caps
    any backlog at somaxconn anyway)."""
    if props.socket_listen_backlog_size is not None:
        return props.socket_listen_backlog_size
    try:
        with open(somaxconn) as handle:
            return max(1, min(int(handle.read()), 4096))
    except (OSError, ValueError):
        return 4096


CONTROL_PLANE_RESERVE = MIB


def pool_reservations(props: ServerProperties, listeners,
                      control_plane: str | None) -> dict[str, int]:
    """The memory pool's bytes reserved per listener, the control plane's default included."""
    key = "pybroker.queued.max.request.bytes.reserved"
    pool = props.queued_max_request_bytes
    if pool > 0 and pool < props.socket_request_max_bytes:
        raise ConfigError(f"queued.max.request.bytes: {pool} is smaller than "
                          f"socket.request.max.bytes {props.socket_request_max_bytes}")
    reserved: dict[str, int] = {}
    names = {listener.name for listener in listeners}
    for item in split_csv(props.pybroker_queued_max_request_bytes_reserved):
        name, sep, size = item.rpartition(":")
        if not sep or not size.isdigit() or int(size) < 1:
            raise ConfigError(f"{key}: invalid entry {item!r} (expected LISTENER:bytes)")
        if name.upper() not in names:
            raise ConfigError(f"{key}: listener {name} is not in listeners")
        reserved[name.upper()] = int(size)
    if reserved and pool <= 0:
        raise ConfigError(f"{key}: reservations need queued.max.request.bytes to be set")
    if control_plane is not None and pool > 0 and control_plane not in reserved:
        # So a pool exhausted by clients can never mute the control plane.
        reserved[control_plane] = min(CONTROL_PLANE_RESERVE, pool // 4)
    if reserved and sum(reserved.values()) >= pool:
        raise ConfigError(f"{key}: reservations ({sum(reserved.values())} bytes) leave nothing "
                          f"of queued.max.request.bytes {pool} to share")
    return reserved


def proxy_listeners(props: ServerProperties, listeners) -> frozenset[str]:
    """The listeners behind a PROXY protocol balancer, once their trusted CIDRs check out."""
    names = frozenset(name.upper() for name in split_csv(props.pybroker_proxy_protocol_listeners))
    unknown = names - {listener.name for listener in listeners}
    if unknown:
        raise ConfigError(f"pybroker.proxy.protocol.listeners: no listener named "
                          f"{', '.join(sorted(unknown))}")
    cidrs = split_csv(props.pybroker_proxy_protocol_trusted_cidrs)
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"pybroker.proxy.protocol.trusted.cidrs: {cidr!r} is not a "
                              f"CIDR") from None
    if names and not cidrs:
        raise ConfigError("pybroker.proxy.protocol.listeners needs "
                          "pybroker.proxy.protocol.trusted.cidrs (the balancers' addresses)")
    return names
