"""Per-IP and per-user override lists: their syntax, and the networks the per-IP ones name.

`max.connections.per.ip.overrides` is Kafka's (`host:N,ip:N,cidr:N`);
`pybroker.max.connections.per.user.overrides` and
`pybroker.max.connection.creation.rate.per.user.overrides` are ours (`user:N,...`, a user name
being a principal's name: `alice` for `User:alice`).  Read by the config check at start-up
(form only), by the parent's dynamic config (host names through broker.parent.resolver, off
the event loop) and by tests.  Shared: no process state.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from broker.shared.constants import INT_MAX


def resolve_now(host: str) -> list:
    """The networks (one address each) a host name stands for; raises OSError.  Blocks."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return sorted({ipaddress.ip_network(info[4][0]) for info in infos}, key=str)


def address_of(ip: str):
    """The address of a peer IP (a zone suffix dropped), or None if it is not one."""
    try:
        return ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None


_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")


def parse_ip_overrides(text: str, key: str = "max.connections.per.ip.overrides",
                       resolve=None):
    """`host:N,ip:N,cidr:N` -> ((network, N), ...), most specific first.

    Raises ValueError naming the entry.  A host name stands for every address `resolve(host)`
    gives: by default it is resolved now (start-up only: it blocks); a resolver may answer
    None for "not known yet" (the entry is left out) - see broker.parent.resolver.
    """
    entries: list[tuple[ipaddress._BaseNetwork, int]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        target, sep, count = item.rpartition(":")
        if not sep or not target or not count.strip().lstrip("-").isdigit():
            raise ValueError(f"{key}: invalid entry {item!r} (expected host:N, ip:N or cidr:N)")
        limit = int(count)
        if limit < 0:
            raise ValueError(f"{key}: {item!r} has a negative limit")
        target = target.strip().strip("[]")
        for network in _networks(target, key, resolve):
            entries.append((network, limit))
    entries.sort(key=lambda entry: entry[0].prefixlen, reverse=True)
    return tuple(entries)


def override_hosts(text: str) -> set[str]:
    """The host names (not addresses) an overrides value names."""
    hosts = set()
    for item in (part.strip() for part in text.split(",")):
        target = item.rpartition(":")[0].strip().strip("[]")
        if target and _address_or_network(target) is None:
            hosts.add(target)
    return hosts


def syntax_only(host: str) -> list:
    """A resolver that checks the name's form only (validating a change on the event loop)."""
    return []


def _address_or_network(target: str):
    try:
        return ipaddress.ip_network(target, strict=False)
    except ValueError:
        return None


def _networks(target: str, key: str, resolve):
    network = _address_or_network(target)
    if network is not None:
        return [network]
    if not _HOST.fullmatch(target):
        raise ValueError(f"{key}: {target!r} is neither an address, a network nor a host name")
    if resolve is None:
        try:
            return resolve_now(target)
        except OSError as error:
            raise ValueError(f"{key}: cannot resolve host {target!r} ({error})") from None
    return resolve(target) or []


def parse_user_overrides(text: str, key: str) -> dict[str, int]:
    """`user:N,user:N` -> {user: N}; a name may hold ':' (the last one splits) but not ','.
    Raises ValueError naming the entry."""
    limits: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        user, sep, count = item.rpartition(":")
        user, count = user.strip(), count.strip()
        if not sep or not user or not count.isdigit():
            raise ValueError(f"{key}: invalid entry {item!r} (expected user:N, N >= 0)")
        if int(count) > INT_MAX:
            raise ValueError(f"{key}: {item!r} is more than {INT_MAX}")
        limits[user] = int(count)
    return limits
