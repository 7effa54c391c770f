"""Loading: raw key/value pairs checked into the frozen `BrokerConfig` every process runs with.

`load_config` converts the declared keys (keys.py), then checks what spans several keys: the
listeners (listeners.py), their TLS and SASL settings (security.py), quota overrides, topic
defaults, the authorizer and super users, the event log's directory.  Every failure is a
ConfigError whose message is one line naming the key; `python -m broker` prints it and exits
with status 2.

Not pure: loading reads each TLS listener's key and trust stores (security.py) and the CPUs
this process may use (listeners.py).  Nothing binds a socket or creates a directory.
"""

from __future__ import annotations

import os

import ssl

import msgspec

from broker.shared.acl import parse_super_users
from broker.shared.config.keys import (SERVER_ASSIGNORS, ConfigError, ServerProperties,
                                       server_properties)
from broker.shared.config.listeners import (Listener, advertised_listeners, check_distinct_ports,
                                            control_plane_listener, inter_broker_listener,
                                            listener_limits, parse_listeners, parse_protocol_map,
                                            pool_reservations, proxy_listeners,
                                            split_listener_keys)
from broker.shared.config.properties import split_csv
from broker.shared.config.security import sasl_settings, tls_settings
from broker.shared.log import compression
from broker.shared.overrides import parse_ip_overrides, parse_user_overrides, syntax_only
from broker.shared.sasl import SaslSettings
from broker.shared.tls import TlsSettings
from broker.shared.upstream_security import UpstreamSecurity


class BrokerConfig(msgspec.Struct, frozen=True):
    """The validated configuration; sent as is to every worker process."""

    props: ServerProperties
    listener_props: dict[str, dict[str, int]]  # listener name -> {key: value}
    pool_reserved: dict[str, int]  # listener name -> bytes reserved in the memory pool
    node_id: int
    listeners: tuple[Listener, ...]
    advertised: tuple[Listener, ...]
    inter_broker_listener: str
    control_plane_listener: str | None
    log_dirs: tuple[str, ...]
    prometheus: tuple[str, int] | None
    event_log_dir: str | None = None  # None when the event log is off
    listener_tls: dict[str, TlsSettings] = {}  # SSL listener name -> its ssl.* settings
    listener_sasl: dict[str, SaslSettings] = {}  # SASL listener name -> mechanisms, users
    super_users: frozenset[str] = frozenset()  # super.users, parsed
    proxy_listeners: frozenset[str] = frozenset()  # listeners behind a PROXY protocol balancer
    # Front-end mode: the upstream Kafka cluster's bootstrap (host, port) pairs; empty: off.
    upstream: tuple[tuple[str, int], ...] = ()

    def node_port(self, listener_index: int, node_id: int) -> int:
        """Front-end mode: the port of `listener_index` through which upstream node
        `node_id` is reached (see pybroker.frontend.node.port.base)."""
        props = self.props
        return (props.pybroker_frontend_node_port_base
                + listener_index * props.pybroker_frontend_node_ports_per_listener + node_id)

    def authorizing(self) -> bool:
        """Whether ACLs decide requests (authorizer.class.name is set)."""
        return bool(self.props.authorizer_class_name)

    def listener_index(self, name: str) -> int:
        for index, listener in enumerate(self.listeners):
            if listener.name == name:
                return index
        raise KeyError(name)

    def control_plane_index(self) -> int | None:
        """Index of the control-plane listener, or None without a control plane."""
        if self.control_plane_listener is None:
            return None
        return self.listener_index(self.control_plane_listener)

    def data_listener_indexes(self) -> list[int]:
        control = self.control_plane_index()
        return [index for index in range(len(self.listeners)) if index != control]

    def may_alter(self, listener_index: int) -> bool:
        """Whether config, quota and topic changes are served on this listener."""
        control = self.control_plane_index()
        return (control is None or listener_index == control
                or self.props.pybroker_control_plane_alter_on_data_listeners)

    def pool_reserved_by_index(self) -> dict[int, int]:
        """The memory pool's reservations keyed by listener index."""
        return {self.listener_index(name): size for name, size in self.pool_reserved.items()}

    def with_bound_ports(self, ports: dict[str, int]) -> "BrokerConfig":
        """Return a copy where port 0 listeners (and their advertised twins) carry `ports`."""

        def bind(listener: Listener) -> Listener:
            if listener.port == 0 and listener.name in ports:
                return msgspec.structs.replace(listener, port=ports[listener.name])
            return listener

        return msgspec.structs.replace(
            self,
            listeners=tuple(bind(item) for item in self.listeners),
            advertised=tuple(bind(item) for item in self.advertised),
        )


def load_config(raw: dict[str, str]) -> BrokerConfig:
    """Validate raw key/value pairs into a BrokerConfig, or raise ConfigError."""
    raw, per_listener, per_listener_security = split_listener_keys(raw)
    props = server_properties(raw)
    _check_quota_settings(props)
    _check_topic_defaults(props)
    if props.group_min_session_timeout_ms > props.group_max_session_timeout_ms:
        raise ConfigError(f"group.min.session.timeout.ms: {props.group_min_session_timeout_ms} "
                          f"is more than group.max.session.timeout.ms "
                          f"{props.group_max_session_timeout_ms}")
    _check_consumer_groups(props)
    protocols = parse_protocol_map(props.listener_security_protocol_map)
    listeners = parse_listeners("listeners", props.listeners, protocols)
    check_distinct_ports(listeners)
    log_dirs = tuple(split_csv(props.log_dirs or props.log_dir))
    if not log_dirs:
        raise ConfigError("log.dirs: at least one directory is required")
    advertised = advertised_listeners(props, listeners, protocols)
    inter_broker = inter_broker_listener(props, listeners)
    control_plane = control_plane_listener(props, protocols, listeners, advertised, inter_broker)
    return BrokerConfig(
        props=props,
        listener_props=listener_limits(per_listener, listeners),
        listener_tls=tls_settings(props, per_listener_security, listeners),
        listener_sasl=sasl_settings(props, per_listener_security, listeners),
        pool_reserved=pool_reservations(props, listeners, control_plane),
        node_id=_node_id(props),
        listeners=listeners,
        advertised=advertised,
        inter_broker_listener=inter_broker,
        control_plane_listener=control_plane,
        log_dirs=log_dirs,
        prometheus=_parse_host_port("prometheus.listen", props.prometheus_listen),
        event_log_dir=_event_log_dir(props, log_dirs),
        super_users=_check_authorizer(props),
        proxy_listeners=proxy_listeners(props, listeners),
        upstream=_upstream(props, listeners),
    )


def _upstream(props: ServerProperties, listeners) -> tuple[tuple[str, int], ...]:
    """Front-end mode's upstream bootstrap servers, with the node ports checked to fit."""
    servers = tuple(_parse_host_port("pybroker.upstream.bootstrap.servers", item)
                    for item in split_csv(props.pybroker_upstream_bootstrap_servers))
    if not servers:
        return ()
    try:
        UpstreamSecurity.of(props)  # the settings' checks, the CA file read
    except ValueError as error:
        raise ConfigError(str(error)) from None
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"pybroker.upstream.ssl.ca.location: "
                          f"{props.pybroker_upstream_ssl_ca_location!r}: {error}") from None
    base, width = (props.pybroker_frontend_node_port_base,
                   props.pybroker_frontend_node_ports_per_listener)
    if base == 0:
        raise ConfigError("pybroker.frontend.node.port.base: required with "
                          "pybroker.upstream.bootstrap.servers")
    if base + len(listeners) * width > 65536:
        raise ConfigError(f"pybroker.frontend.node.port.base: {base} + {len(listeners)} "
                          f"listeners x {width} ports passes 65535")
    for listener in listeners:
        if base <= listener.port < base + len(listeners) * width:
            raise ConfigError(f"listeners: {listener.name} port {listener.port} is among the "
                              f"node ports from pybroker.frontend.node.port.base {base}")
    return servers


def _check_consumer_groups(props: ServerProperties) -> None:
    """Kafka's checks of the consumer and share group protocols' keys
    (GroupCoordinatorConfig, ShareGroupConfig)."""
    for kind in ("consumer", "share"):
        for key in ("heartbeat.interval", "session.timeout"):
            name = key.replace(".", "_")
            value = getattr(props, f"group_{kind}_{name}_ms")
            low = getattr(props, f"group_{kind}_min_{name}_ms")
            high = getattr(props, f"group_{kind}_max_{name}_ms")
            if not low <= value <= high:
                raise ConfigError(f"group.{kind}.{key}.ms: {value} is outside "
                                  f"group.{kind}.min.{key}.ms {low} and "
                                  f"group.{kind}.max.{key}.ms {high}")
        interval = getattr(props, f"group_{kind}_heartbeat_interval_ms")
        session = getattr(props, f"group_{kind}_session_timeout_ms")
        if interval >= session:
            raise ConfigError(f"group.{kind}.heartbeat.interval.ms: {interval} must be less "
                              f"than group.{kind}.session.timeout.ms {session}")
    lock, low, high = (props.group_share_record_lock_duration_ms,
                       props.group_share_min_record_lock_duration_ms,
                       props.group_share_max_record_lock_duration_ms)
    if not low <= lock <= high:
        raise ConfigError(f"group.share.record.lock.duration.ms: {lock} is outside "
                          f"group.share.min.record.lock.duration.ms {low} and "
                          f"group.share.max.record.lock.duration.ms {high}")
    assignors = split_csv(props.group_consumer_assignors)
    unknown = [name for name in assignors if name not in SERVER_ASSIGNORS]
    if not assignors or unknown:
        raise ConfigError(f"group.consumer.assignors: {props.group_consumer_assignors!r} "
                          f"(known: {', '.join(SERVER_ASSIGNORS)})")


def _node_id(props: ServerProperties) -> int:
    if props.node_id is not None and props.broker_id is not None and props.node_id != props.broker_id:
        raise ConfigError(f"node.id: {props.node_id} differs from broker.id {props.broker_id}")
    if props.node_id is not None:
        return props.node_id
    return props.broker_id if props.broker_id is not None else 0


def _parse_host_port(key: str, value: str) -> tuple[str, int] | None:
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: invalid address {value!r} (expected HOST:PORT)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _check_quota_settings(props: ServerProperties) -> None:
    burst = props.pybroker_quota_burst_windows
    if burst is not None and burst > props.quota_window_num - 1:
        raise ConfigError(f"pybroker.quota.burst.windows: {burst} is more than quota.window.num "
                          f"- 1 ({props.quota_window_num - 1})")
    try:
        # The form only: host names are resolved by the parent, off its loop
        # (broker.parent.resolver).
        parse_ip_overrides(props.max_connections_per_ip_overrides, resolve=syntax_only)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    for key in ("pybroker.max.connections.per.user.overrides",
                "pybroker.max.connection.creation.rate.per.user.overrides"):
        try:
            parse_user_overrides(getattr(props, key.replace(".", "_")), key)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    if props.max_connections_per_ip == 0 and not props.max_connections_per_ip_overrides.strip():
        raise ConfigError("max.connections.per.ip: 0 is only allowed together with "
                          "max.connections.per.ip.overrides")


def _check_topic_defaults(props: ServerProperties) -> None:
    """The broker keys behind topic configs whose values are names (broker.shared.log.topic_config)."""
    policy = split_csv(props.log_cleanup_policy)
    if not policy or set(policy) - {"delete", "compact"}:
        raise ConfigError(f"log.cleanup.policy: {props.log_cleanup_policy!r} is not delete, "
                          f"compact or both")
    if props.log_message_timestamp_type not in ("CreateTime", "LogAppendTime"):
        raise ConfigError(f"log.message.timestamp.type: {props.log_message_timestamp_type!r} is "
                          f"not CreateTime or LogAppendTime")
    if props.compression_type not in compression.TYPES:
        raise ConfigError(f"compression.type: {props.compression_type!r} is not one of "
                          f"{', '.join(compression.TYPES)}")
    problem = compression.level_problem("gzip", props.compression_gzip_level)
    if problem:
        raise ConfigError(f"compression.gzip.level: {problem}")


AUTHORIZERS = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
               "kafka.security.authorizer.AclAuthorizer")


def _check_authorizer(props: ServerProperties) -> frozenset[str]:
    name = props.authorizer_class_name
    if name and name not in AUTHORIZERS:
        raise ConfigError(f"authorizer.class.name: {name!r} is not one of {', '.join(AUTHORIZERS)}")
    try:
        return parse_super_users(props.super_users)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _event_log_dir(props: ServerProperties, log_dirs: tuple[str, ...]) -> str | None:
    if props.pybroker_event_log_total_bytes < props.pybroker_event_log_file_bytes:
        raise ConfigError(f"pybroker.event.log.total.bytes: {props.pybroker_event_log_total_bytes} "
                          f"is less than pybroker.event.log.file.bytes "
                          f"{props.pybroker_event_log_file_bytes}")
    if not props.pybroker_event_log_enable:
        return None
    if props.pybroker_event_log_dir:
        return props.pybroker_event_log_dir
    parent = os.path.dirname(os.path.abspath(log_dirs[0]))
    return os.path.join(parent, "pybroker-events")
