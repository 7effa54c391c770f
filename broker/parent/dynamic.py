"""Dynamic configuration: what IncrementalAlterConfigs and AlterClientQuotas change at run time.

Layers, highest first (Kafka's precedence): this broker's dynamic value, the cluster-default
dynamic value (resource name ""), the static value from the file/overrides, the built-in
default.  The dynamic layers and the `ip` entity's connection_creation_rate quotas are kept in
`<first log dir>/.pybroker-dynamic.json`, written atomically (temporary file, fsync, rename)
before a change is acknowledged, and read back at start-up, so a change survives restarts
(Kafka lost them: KAFKA-18637).  The parent is the only writer.

A key takes one of four paths (`classify`), as Kafka 4.4 decides (broker.parent.kafka_broker_keys):
  applied  - changed at run time here: the connection limits (also per listener), the SSL
             listeners' key and trust stores, the shadow modes, the per-user limits;
  stored   - the rest of Kafka's dynamic keys (also listener.name.<l>.<key> of any listener):
             checked as Kafka checks them and stored, but without effect here; the change logs
             one line saying so and why, and DescribeConfigs' documentation says it too;
  custom   - a key Kafka does not know: stored as Kafka keeps custom configs (for plugins), its
             value never shown (Kafka cannot tell it is no secret);
  static   - Kafka's and this broker's keys that cannot change at run time: INVALID_REQUEST,
             "Cannot update these configs dynamically", as Kafka.
A layer holds at most MAX_STORED_KEYS keys of MAX_STORED_BYTES in all.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

import msgspec

from broker.parent import kafka_broker_keys as kafka
from broker.parent.admission import SHADOW_FAMILIES, Limits
from broker.shared.config import (LISTENER_KEYS, BrokerConfig, ServerProperties, declared_keys,
                                   key_doc)
from broker.shared.config.values import CONFIG_TYPES, InvalidValue, checked
from broker.shared.constants import INT_MAX
from broker.shared.overrides import (override_hosts, parse_ip_overrides, parse_user_overrides,
                                     syntax_only)
from broker.shared.tls import SECRET_KEYS, TlsConfigError, TlsSettings, server_context

STORE_FILE = ".pybroker-dynamic.json"
DEFAULT_ENTITY = "<default>"  # the key of an entity's default quota in the store
IP_RATE_KEY = "connection_creation_rate"
# Kafka's config sources (DescribeConfigs v1+).
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = \
    2, 3, 4, 5
NO_EFFECT = "Stored as Kafka stores it, but without effect here: {why}."
APPLIED_TYPES = {"int": 3, "list": 7, "string": 2, "boolean": 1, "users": 7}  # pybroker.*
# One dynamic layer's keys, and their names and values together: each change rewrites the
# store, and DescribeConfigs lists what it holds.
MAX_STORED_KEYS = 1000
MAX_STORED_BYTES = 1 << 20
_LISTENER_KEY = re.compile(r"listener\.name\.([^.]*)\.(.+)")  # Kafka's ListenerConfigRegex


class ConfigProblem(ValueError):
    """A rejected change; `code` is the Kafka error name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


CONTROL_PLANE_MAX_CONNECTIONS = 100  # unless listener.name.<cp>.max.connections says otherwise


@dataclass(frozen=True)
class DynamicKey:
    name: str
    # "int", "boolean", "string", "list" (host:N entries), "users" (user:N), or "stored" (a
    # key kept without effect: `kafka` checks its value, `no_effect` says why)
    kind: str
    minimum: int = 0
    doc: str = ""
    kafka: kafka.KafkaKey | None = None  # Kafka's definition of a stored key (None: custom)
    no_effect: str = ""

    @property
    def applied(self) -> bool:
        return self.kind != "stored"

    @property
    def is_list(self) -> bool:
        """APPEND and SUBTRACT apply to it."""
        return self.kind in ("list", "users") or (self.kafka is not None
                                                  and self.kafka.kind == "list")


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
        return self.layers(key)[0]

    def layers(self, key: str) -> list[tuple[str | None, int]]:
        """(value, source) of a broker key in each layer that has one, highest first (the
        synonyms DescribeConfigs lists); at least the default, None if it has none."""
        found = []
        if key in self.stored.broker:
            found.append((self.stored.broker[key], DYNAMIC_BROKER_CONFIG))
        if key in self.stored.cluster_default:
            found.append((self.stored.cluster_default[key], DYNAMIC_DEFAULT_BROKER_CONFIG))
        found += self._static(key)
        return found

    def _static(self, key: str) -> list[tuple[str | None, int]]:
        """The static value (if the configuration sets one) and the default."""
        for listener, values in self.config.listener_props.items():
            for suffix, number in values.items():
                if self.listener_key(listener, suffix) == key:
                    return [(str(number), STATIC_BROKER_CONFIG)]
        field_name = key.replace(".", "_")
        if key in _DECLARED:
            value, default = getattr(self.config.props, field_name), _DEFAULTS.get(field_name)
            default_text = None if default is None else _as_text(default)
            if value != default:
                return [(_as_text(value), STATIC_BROKER_CONFIG), (default_text, DEFAULT_CONFIG)]
            return [(default_text, DEFAULT_CONFIG)]
        known = kafka.DYNAMIC.get(key)
        return [(known.default if known is not None else None, DEFAULT_CONFIG)]

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
            except TlsConfigError as error:  # Kafka's answer to a key store it cannot load
                raise ConfigProblem("invalid_request", str(error)) from None

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
        """How a key may change (see the module docstring); ConfigProblem for a static key or
        a security key without its listener prefix, in Kafka's words."""
        spec = BROKER_KEYS.get(key)
        if spec is not None:
            return spec
        listener_key = _LISTENER_KEY.fullmatch(key)
        if listener_key is not None:
            return self._listener_spec(key, *listener_key.groups())
        if key in kafka.PER_LISTENER_ONLY:
            raise ConfigProblem("invalid_request", "These security configs can be dynamically "
                                                   "updated only per-listener using the "
                                                   f"listener prefix: [{key}]")
        known = kafka.DYNAMIC.get(key)
        if known is not None:
            return DynamicKey(key, "stored", kafka=known,
                              no_effect=kafka.no_effect(key, key in _DECLARED))
        if key in kafka.STATIC or key in _DECLARED:
            raise ConfigProblem("invalid_request",
                                f"Cannot update these configs dynamically: [{key}]")
        return DynamicKey(key, "stored", no_effect="this broker has no such setting")

    def _listener_spec(self, key: str, listener: str, suffix: str) -> DynamicKey:
        """listener.name.<listener>.<suffix>: applied for the limits of a listener this
        broker has and the key and trust stores of its SSL listeners; any other is stored, as
        Kafka takes them all."""
        names = {item.name.lower(): item.name for item in self.config.listeners}
        name = names.get(listener)
        if name is not None and suffix in LISTENER_KEYS:
            return LISTENER_DYNAMIC[suffix]
        if name is not None and name in self.config.listener_tls and suffix in TLS_DYNAMIC:
            return TLS_DYNAMIC[suffix]
        if name is None:
            why = f"this broker has no listener {listener}"
        elif suffix in TLS_DYNAMIC:
            why = f"listener {name} is not an SSL listener"
        else:
            why = kafka.no_effect(key, suffix in _DECLARED)
        return DynamicKey(key, "stored", kafka=kafka.DYNAMIC.get(suffix), no_effect=why)

    def classify(self, key: str) -> str:
        """"applied", "stored", "custom" or "static" (see the module docstring)."""
        try:
            return _kind_of(key, self.check_key(key))
        except ConfigProblem:
            return "static"

    def sensitive(self, key: str, kind: str | None = None) -> bool:
        """Never shown, logged or recorded: a key or trust store's secret, a password Kafka
        knows (also per listener or per mechanism), a key Kafka does not know (`kind`: its
        classification, if known already)."""
        return kafka.base_name(key) in SECRET_KEYS or kafka.password(key) or \
            (kind or self.classify(key)) == "custom"

    def describe(self, key: str, cluster_default: bool, synonyms: bool,
                 documentation: bool) -> dict | None:
        """DescribeConfigs' entry of a broker key (of the cluster default's layer when
        `cluster_default`: only the keys it holds, as Kafka), or None to leave it out."""
        chain = self.layers(key)
        if cluster_default:  # that layer's value alone, as Kafka
            chain = [layer for layer in chain if layer[1] == DYNAMIC_DEFAULT_BROKER_CONFIG]
            if not chain:
                return None
        try:
            spec = self.check_key(key)
        except ConfigProblem:
            spec = None  # a static key
        kind = _kind_of(key, spec)
        if kind == "custom" and chain[0][1] not in (DYNAMIC_BROKER_CONFIG,
                                                    DYNAMIC_DEFAULT_BROKER_CONFIG):
            return None  # a key nobody knows, and not stored: Kafka leaves it out
        secret = self.sensitive(key, kind)
        return {"name": key, "value": None if secret else chain[0][0],
                # Kafka's dynamic keys may change (an SSL key store's: with a listener prefix)
                "read_only": kind == "custom" or (kind == "static" and key not in kafka.DYNAMIC),
                "config_source": chain[0][1],
                "is_sensitive": secret,
                "synonyms": [{"name": key, "value": None if secret else value, "source": source}
                             for value, source in chain if value is not None] if synonyms else [],
                "config_type": _config_type(key, spec),
                "documentation": _documentation(key, spec) if documentation else None}

    def check_room(self, layer: dict[str, str]) -> None:
        """ConfigProblem if a layer would hold more than its bound."""
        size = sum(len(key) + len(value) for key, value in layer.items())
        if len(layer) > MAX_STORED_KEYS or size > MAX_STORED_BYTES:
            raise ConfigProblem("invalid_request",
                                f"a dynamic config layer holds at most {MAX_STORED_KEYS} keys "
                                f"of {MAX_STORED_BYTES} bytes in all; this change would make "
                                f"{len(layer)} of {size}")

    def alter(self, layer: dict[str, str], key: str, operation: int, value: str | None,
              cluster_default: bool = False) -> None:
        """Apply one IncrementalAlterConfigs operation to a copy-on-write layer dict (the
        cluster default's when `cluster_default`)."""
        spec = self.check_key(key)
        if operation == 1:  # DELETE
            layer.pop(key, None)
            return
        if operation not in (0, 2, 3):
            raise ConfigProblem("invalid_request", f"unknown config operation {operation}")
        if value is None:
            raise ConfigProblem("invalid_request", f"Null value not supported for : {key}")
        if operation in (2, 3) and not spec.is_list:  # APPEND, SUBTRACT
            raise ConfigProblem("invalid_config", "Config value append is not allowed for "
                                                  f"config key: {key}")
        if spec.applied:
            self._alter_applied(spec, layer, key, operation, value)
        else:
            layer[key] = self._stored_value(spec, layer, operation, value)
        if cluster_default and _per_broker(key):
            raise ConfigProblem("invalid_request", "Cannot update these configs at default "
                                                   "cluster level, broker id must be specified: "
                                                   f"[{key}]")

    def _stored_value(self, spec: DynamicKey, layer: dict[str, str], operation: int,
                      value: str) -> str:
        """A stored key's new value, checked as Kafka checks it (INVALID_REQUEST, as Kafka's
        broker config validation answers)."""
        known = spec.kafka
        if operation in (2, 3):
            value = _merged(self._current(layer, spec.name), operation, value)
        if known is None:
            return value
        try:
            return known.checked(value)
        except InvalidValue as error:
            raise ConfigProblem("invalid_request", str(error)) from None

    def _alter_applied(self, spec: DynamicKey, layer: dict[str, str], key: str, operation: int,
                       value: str) -> None:
        if spec.kind == "string":
            layer[key] = value
            return
        if spec.kind in ("int", "boolean"):
            layer[key] = _checked(key, spec.kind, value, spec.minimum)
            return
        joined = _merged(self._current(layer, key), operation, value)
        try:  # the form only: names are resolved off the loop when the limits apply
            if spec.kind == "users":
                parse_user_overrides(joined, key)
            else:
                parse_ip_overrides(joined, key, resolve=syntax_only)
        except ValueError as error:
            raise ConfigProblem("invalid_request", str(error)) from None
        layer[key] = joined

    def _current(self, layer: dict[str, str], key: str) -> str:
        """A list key's value before an APPEND or SUBTRACT: the layer's, else the one in force."""
        return layer.get(key) or self.value(key)[0] or ""

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


def _checked(name: str, kind: str, value: str, minimum: int) -> str:
    """An applied key's value as stored; INVALID_REQUEST in Kafka's words, as Kafka's broker
    config validation answers."""
    try:
        return checked(name, kind, value, minimum)
    except InvalidValue as error:
        raise ConfigProblem("invalid_request", str(error)) from None


def _kind_of(key: str, spec: DynamicKey | None) -> str:
    """A key's path given what check_key said of it (None: it refused it as static)."""
    if spec is None:
        return "static"
    if spec.applied:
        return "applied"
    return "stored" if spec.kafka is not None or _LISTENER_KEY.fullmatch(key) else "custom"


def _config_type(key: str, spec: DynamicKey | None) -> int:
    """Kafka's type of a broker key (DescribeConfigs v3+): Kafka's own for its dynamic keys,
    0 (UNKNOWN) for one Kafka does not know, STRING for a static one."""
    known = kafka.DYNAMIC.get(kafka.base_name(key))
    if known is not None:
        return CONFIG_TYPES[known.kind]
    if spec is None:
        return CONFIG_TYPES["string"]
    return APPLIED_TYPES.get(spec.kind, CONFIG_TYPES["string"]) if spec.applied else 0


def _documentation(key: str, spec: DynamicKey | None) -> str | None:
    """What DescribeConfigs tells of a broker key: its doc, and for a key stored without
    effect, that and why."""
    if spec is None or spec.applied:
        return (spec.doc if spec is not None else key_doc(key)) or None
    doc = key_doc(key)
    return f"{doc} {NO_EFFECT.format(why=spec.no_effect)}".strip()


def _merged(current: str, operation: int, value: str) -> str:
    """A list key's value after SET (0), APPEND (2) or SUBTRACT (3) of `value`'s items."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    held = [item for item in current.split(",") if item]
    if operation == 2:
        return ",".join(held + [item for item in items if item not in held])
    if operation == 3:
        return ",".join(item for item in held if item not in items)
    return ",".join(items)


def _per_broker(key: str) -> bool:
    """Kafka refuses it at the cluster-default level (resource ""): a per-broker key, or a
    listener's key other than its connection limits and thread count."""
    listener_key = _LISTENER_KEY.fullmatch(key)
    if listener_key is not None:
        return listener_key.group(2) not in kafka.CLUSTER_LEVEL_LISTENER_KEYS
    known = kafka.DYNAMIC.get(key)
    return known is not None and known.per_broker


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
_DECLARED = frozenset(field.encode_name for field in declared_keys())
