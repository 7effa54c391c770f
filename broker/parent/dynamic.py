"""Dynamic configuration: what IncrementalAlterConfigs and AlterClientQuotas change at run time.

Layers, highest first (Kafka's precedence): this broker's dynamic value, the cluster-default
dynamic value (resource name ""), the static value from the file/overrides, the built-in
default.  The dynamic layers and the `ip` entity's connection_creation_rate quotas are kept in
`<first log dir>/.pybroker-dynamic.json`, written atomically (temporary file, fsync, rename)
before a change is acknowledged, and read back at start-up, so a change survives restarts
(Kafka lost them: KAFKA-18637).  The parent is the only writer.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

import msgspec

from broker.parent.admission import SHADOW_FAMILIES, Limits
from broker.shared.config import LISTENER_KEYS, BrokerConfig, ServerProperties
from broker.shared.constants import INT_MAX
from broker.shared.log.topic_config import DEFAULT_CONFIG, STATIC_BROKER_CONFIG
from broker.shared.overrides import (override_hosts, parse_ip_overrides, parse_user_overrides,
                                     syntax_only)
from broker.shared.tls import TlsConfigError, TlsSettings, server_context

STORE_FILE = ".pybroker-dynamic.json"
DEFAULT_ENTITY = "<default>"  # the key of an entity's default quota in the store
IP_RATE_KEY = "connection_creation_rate"


class ConfigProblem(ValueError):
    """A rejected change; `code` is the Kafka error name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


# Kafka's config sources of the BROKER resource (DescribeConfigsResponse.ConfigSource).
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 2, 3

CONTROL_PLANE_MAX_CONNECTIONS = 100  # unless listener.name.<cp>.max.connections says otherwise


@dataclass(frozen=True)
class DynamicKey:
    name: str
    kind: str  # "int", "boolean", "string", "list" (host:N entries) or "users" (user:N)
    minimum: int = 0
    doc: str = ""


BROKER_KEYS = {key.name: key for key in (
    DynamicKey("max.connections", "int", 0, "Connections the broker accepts in all."),
    DynamicKey("max.connections.per.ip", "int", 0, "Connections one IP address may hold."),
    DynamicKey("max.connections.per.ip.overrides", "list", 0, "host:N, ip:N or cidr:N entries."),
    DynamicKey("max.connection.creation.rate", "int", 0, "New connections per second."),
    DynamicKey("pybroker.max.connections.per.user", "int", 0,
               "Connections one authenticated principal may hold."),
    DynamicKey("pybroker.max.connections.per.user.overrides", "users", 0, "user:N entries."),
    DynamicKey("pybroker.max.connection.creation.rate.per.user", "int", 0,
               "Authenticated connections per second of one principal."),
    DynamicKey("pybroker.max.connection.creation.rate.per.user.overrides", "users", 0,
               "user:N entries."),
    *(DynamicKey(f"pybroker.shadow.{family}", "boolean", 0,
                 f"Shadow mode (observe only) for {family}.") for family in SHADOW_FAMILIES),
    DynamicKey("pybroker.shadow.client.quotas", "boolean", 0,
               "Shadow mode (observe only) for client quotas."),
)}
# Per listener, a dynamic limit must be positive (Kafka's rule).
LISTENER_DYNAMIC = {name: DynamicKey(name, "int", 1) for name in LISTENER_KEYS}
# An SSL listener's key store and trust store may be replaced at run time, as in Kafka (new
# handshakes use them); the change is checked by building the listener's context first.
TLS_DYNAMIC = {name: DynamicKey(name, "string", 0, "SSL listeners' key and trust stores.")
               for name in ("ssl.keystore.type", "ssl.keystore.location",
                            "ssl.keystore.password", "ssl.keystore.key",
                            "ssl.keystore.certificate.chain", "ssl.key.password",
                            "ssl.truststore.type", "ssl.truststore.location",
                            "ssl.truststore.certificates")}


class Stored(msgspec.Struct):
    broker: dict[str, str] = {}
    cluster_default: dict[str, str] = {}
    ip_quotas: dict[str, float] = {}
    # broker.shared.client_quotas.entity_key -> values
    client_quotas: dict[str, dict[str, float]] = {}


class DynamicConfig:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.path = os.path.join(config.log_dirs[0], STORE_FILE)
        self.stored = Stored()
        self.resolver = None  # broker.parent.resolver.HostResolver in the parent; None: resolve now

    # --- persistence ----------------------------------------------------------------------

    def load(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                self.stored = msgspec.json.decode(handle.read(), type=Stored)
        except FileNotFoundError:
            self.stored = Stored()

    def save(self) -> None:
        temporary = self.path + ".tmp"
        # It may hold key store passwords (listener.name.<l>.ssl.*): the broker's user only.
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
            handle.write(msgspec.json.encode(self.stored))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    # --- lookups --------------------------------------------------------------------------

    def listener_key(self, listener: str, suffix: str) -> str:
        return f"listener.name.{listener.lower()}.{suffix}"

    def value(self, key: str) -> tuple[str | None, int]:
        """(value, Kafka config source) of a broker key across the layers."""
        layers = self.layers(key)
        return layers[0] if layers else (None, DEFAULT_CONFIG)

    def layers(self, key: str) -> list[tuple[str, int]]:
        """(value, source) of each layer that holds `key`, highest first: what Kafka lists
        as the key's synonyms."""
        found = []
        if key in self.stored.broker:
            found.append((self.stored.broker[key], DYNAMIC_BROKER_CONFIG))
        if key in self.stored.cluster_default:
            found.append((self.stored.cluster_default[key], DYNAMIC_DEFAULT_BROKER_CONFIG))
        return found + self._static(key)

    def _static(self, key: str) -> list[tuple[str, int]]:
        for listener, values in self.config.listener_props.items():
            for suffix, number in values.items():
                if self.listener_key(listener, suffix) == key:
                    return [(str(number), STATIC_BROKER_CONFIG)]
        field_name = key.replace(".", "_")
        if not hasattr(self.config.props, field_name):
            return []
        value, default = getattr(self.config.props, field_name), _DEFAULTS.get(field_name)
        if value == default:
            return [(_as_text(value), DEFAULT_CONFIG)]
        found = [(_as_text(value), STATIC_BROKER_CONFIG)]
        return found if default is None else found + [(_as_text(default), DEFAULT_CONFIG)]

    def listener_tls(self, broker: dict[str, str] | None = None,
                     cluster_default: dict[str, str] | None = None) -> dict[str, TlsSettings]:
        """The SSL listeners' settings in force: the static ones, with the dynamic key and
        trust store keys over them (or those of candidate layers, to check a change)."""
        broker = self.stored.broker if broker is None else broker
        default = self.stored.cluster_default if cluster_default is None else cluster_default
        result = {}
        for name, static in self.config.listener_tls.items():
            values, prefixed = dict(static.values), set(static.prefixed)
            for suffix in TLS_DYNAMIC:
                key = self.listener_key(name, suffix)
                value = broker.get(key, default.get(key))
                if value is not None:
                    values[suffix] = value
                    prefixed.add(suffix)
            result[name] = TlsSettings(name, values, frozenset(prefixed))
        return result

    def check_tls(self, broker: dict[str, str], cluster_default: dict[str, str]) -> None:
        """ConfigProblem unless every SSL listener's context builds with these layers."""
        for settings in self.listener_tls(broker, cluster_default).values():
            try:
                server_context(settings)
            except TlsConfigError as error:
                raise ConfigProblem("invalid_config", str(error)) from None

    def limits(self) -> Limits:
        """The connection limits in force."""
        def number(key: str) -> int:
            value, _ = self.value(key)
            return INT_MAX if value in (None, "") else int(value)

        overrides = self.value("max.connections.per.ip.overrides")[0] or ""
        if self.resolver is not None:
            self.resolver.keep_only(override_hosts(overrides))
        listener_max, listener_rate = {}, {}
        for index, listener in enumerate(self.config.listeners):
            for suffix, target in (("max.connections", listener_max),
                                   ("max.connection.creation.rate", listener_rate)):
                value, _ = self.value(self.listener_key(listener.name, suffix))
                if value is not None:
                    target[index] = int(value)
        control = self.config.control_plane_index()
        if control is not None:
            # Outside every data-plane limit, the control plane needs one of its own.
            listener_max.setdefault(control, CONTROL_PLANE_MAX_CONNECTIONS)
        quotas = self.stored.ip_quotas
        default_rate = quotas.get(DEFAULT_ENTITY)
        return Limits(
            max_connections=number("max.connections"),
            listener_max_connections=listener_max,
            max_connections_per_ip=number("max.connections.per.ip"),
            ip_overrides=parse_ip_overrides(overrides, resolve=self.resolver.lookup
                                            if self.resolver is not None else None),
            max_connection_creation_rate=number("max.connection.creation.rate"),
            listener_creation_rate=listener_rate,
            ip_creation_rate_default=int(default_rate) if default_rate is not None
            else self.config.props.max_connection_creation_rate_per_ip,
            ip_creation_rates={ip: int(rate) for ip, rate in quotas.items() if ip != DEFAULT_ENTITY},
            max_connections_per_user=number("pybroker.max.connections.per.user"),
            user_overrides=self._user_overrides("pybroker.max.connections.per.user.overrides"),
            user_creation_rate=number("pybroker.max.connection.creation.rate.per.user"),
            user_rate_overrides=self._user_overrides(
                "pybroker.max.connection.creation.rate.per.user.overrides"),
            shadow=frozenset(family for family in SHADOW_FAMILIES
                             if self.value(f"pybroker.shadow.{family}")[0] == "true"),
        )

    def _user_overrides(self, key: str) -> dict[str, int]:
        return parse_user_overrides(self.value(key)[0] or "", key)

    # --- changes --------------------------------------------------------------------------

    def check_key(self, key: str) -> DynamicKey:
        spec = BROKER_KEYS.get(key)
        if spec is not None:
            return spec
        for listener in self.config.listeners:
            for suffix in LISTENER_KEYS:
                if key == self.listener_key(listener.name, suffix):
                    return LISTENER_DYNAMIC[suffix]
            if listener.name in self.config.listener_tls:
                for suffix, spec in TLS_DYNAMIC.items():
                    if key == self.listener_key(listener.name, suffix):
                        return spec
        raise ConfigProblem("invalid_request", f"Cannot update {key} dynamically: it is not a "
                                               "dynamic broker config of this broker")

    def alter(self, layer: dict[str, str], key: str, operation: int, value: str | None) -> None:
        """Apply one IncrementalAlterConfigs operation to a copy-on-write layer dict."""
        spec = self.check_key(key)
        if operation == 1:  # DELETE
            layer.pop(key, None)
            return
        if operation in (2, 3) and spec.kind not in ("list", "users"):  # APPEND, SUBTRACT
            raise ConfigProblem("invalid_config", f"{key} is not a list: APPEND and SUBTRACT "
                                                  "do not apply")
        if operation not in (0, 2, 3):
            raise ConfigProblem("invalid_request", f"unknown config operation {operation}")
        if value is None:
            raise ConfigProblem("invalid_config", f"{key}: a value is required")
        if spec.kind == "string":
            layer[key] = value
            return
        if spec.kind == "int":
            layer[key] = str(_checked_int(spec, value))
            return
        if spec.kind == "boolean":
            if value.strip().lower() not in ("true", "false"):
                raise ConfigProblem("invalid_config", f"{key}: {value!r} is not true or false")
            layer[key] = value.strip().lower()
            return
        current = [item for item in (layer.get(key) or self.value(key)[0] or "").split(",") if item]
        items = [item.strip() for item in value.split(",") if item.strip()]
        if operation == 2:
            current += [item for item in items if item not in current]
        elif operation == 3:
            current = [item for item in current if item not in items]
        else:
            current = items
        joined = ",".join(current)
        try:  # the form only: names are resolved off the loop when the limits apply
            if spec.kind == "users":
                parse_user_overrides(joined, key)
            else:
                parse_ip_overrides(joined, key, resolve=syntax_only)
        except ValueError as error:
            raise ConfigProblem("invalid_config", str(error)) from None
        layer[key] = joined

    def alter_ip_quota(self, quotas: dict[str, float], ip: str | None, key: str,
                       value: float, remove: bool) -> None:
        if key != IP_RATE_KEY:
            raise ConfigProblem("invalid_request", f"{key} is not a quota of the ip entity "
                                                   f"(only {IP_RATE_KEY})")
        name = ip_entity_key(ip)
        if remove:
            quotas.pop(name, None)
            return
        if value < 0 or value != int(value) or value > INT_MAX:
            raise ConfigProblem("invalid_request", f"{IP_RATE_KEY} must be a whole number >= 0")
        quotas[name] = float(value)


CLIENT_QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")


def alter_client_quota(quotas: dict[str, dict[str, float]], entity: str, key: str, value: float,
                       remove: bool) -> None:
    """One AlterClientQuotas op on a user/client-id entity (copy-on-write dict of dicts)."""
    if key not in CLIENT_QUOTA_KEYS:
        raise ConfigProblem("invalid_request", f"{key} is not a quota of user/client-id entities "
                                               f"(one of {', '.join(CLIENT_QUOTA_KEYS)})")
    values = dict(quotas.get(entity, {}))
    if remove:
        values.pop(key, None)
    elif value <= 0:
        raise ConfigProblem("invalid_request", f"{key} must be positive, not {value}")
    else:
        values[key] = float(value)
    if values:
        quotas[entity] = values
    else:
        quotas.pop(entity, None)


def _checked_int(spec: DynamicKey, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigProblem("invalid_config", f"Invalid value {value} for configuration "
                                              f"{spec.name}: Not a number of type INT") from None
    if not spec.minimum <= number <= INT_MAX:
        raise ConfigProblem("invalid_config", f"Invalid value {value} for configuration "
                                              f"{spec.name}: Value must be at least {spec.minimum}")
    return number


def ip_entity_key(ip: str | None) -> str:
    """The store's key of an `ip` quota entity: the address normalised, or the default."""
    return DEFAULT_ENTITY if ip is None else _checked_ip(ip)


def _checked_ip(ip: str) -> str:
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        raise ConfigProblem("invalid_request", f"{ip!r} is not an IP address") from None


def _as_text(value) -> str:
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


_DEFAULTS = {field.name: field.default for field in msgspec.structs.fields(ServerProperties)}
