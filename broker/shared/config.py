"""Broker configuration: every key declared once, read from Kafka `.properties` text.

Each key is one field of `ServerProperties`, with its type, default, bounds and doc string
(the field name with `_` read as `.` is the Kafka key).  msgspec converts and bounds-checks
the raw strings; `load_config` then checks what spans several keys (listeners, the security
protocol map, advertised listeners) and returns a frozen `BrokerConfig`.

Parsing is pure: nothing here binds a socket or touches a file except `read_properties_file`.
Every failure is a `ConfigError` whose message is one line naming the key; `python -m broker`
prints it and exits with status 2.

Keys that are not Kafka's carry the prefix `pybroker.`, except `prometheus.listen`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from typing import Annotated

import msgspec
from msgspec import Meta

from broker.shared.acl import parse_super_users
from broker.shared.constants import INT_MAX
from broker.shared.log import compression
from broker.shared.overrides import parse_ip_overrides, parse_user_overrides, syntax_only
from broker.shared.sasl import MECHANISMS, SASL_PROTOCOLS, SaslSettings, plain_users
from broker.shared.tls import (TLS_KEYS, TLS_PROTOCOLS, PrincipalRules, TlsConfigError, TlsSettings,
                               server_context)

__all__ = [
    "BrokerConfig",
    "ConfigError",
    "Listener",
    "ServerProperties",
    "load_config",
    "parse_properties",
    "read_properties_file",
]

MIB = 1024 * 1024
SUPPORTED_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KNOWN_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ConfigError(ValueError):
    """A configuration problem, described in one line that names the key (line breaks a key
    or value carried, from an escape such as `\\n` in a properties file, are shown escaped)."""

    def __init__(self, message: str):
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


def _key(field_name: str) -> str:
    return field_name.replace("_", ".")


def _doc(text: str, **bounds) -> Meta:
    return Meta(description=text, **bounds)


class ServerProperties(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename=_key):
    """The keys this broker understands, with Kafka's names, defaults and meanings."""

    node_id: Annotated[int, _doc("The id of this broker (Kafka's KRaft name).", ge=0)] | None = None
    broker_id: Annotated[int, _doc("Older name of node.id; if both are set they must agree.", ge=0)] | None = None
    listeners: Annotated[str, _doc(
        "Comma-separated NAME://host:port listeners. An empty host binds every interface; "
        "port 0 binds an ephemeral port.")] = "PLAINTEXT://:9092"
    advertised_listeners: Annotated[str, _doc(
        "Listeners given to clients in Metadata; defaults to `listeners`. "
        "A port of 0 is replaced by the bound port of the listener with the same name.")] = ""
    listener_security_protocol_map: Annotated[str, _doc(
        "Comma-separated LISTENER:PROTOCOL pairs: PLAINTEXT, SSL, SASL_PLAINTEXT and "
        "SASL_SSL.")] = (
        "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL")
    ssl_keystore_type: Annotated[str, _doc(
        "SSL listeners: PEM or PKCS12 (Kafka's default, JKS, is Java's own format and is not "
        "supported). Also per listener: listener.name.<l>.ssl.*, as every ssl.* key.")] = "PEM"
    ssl_keystore_location: Annotated[str, _doc(
        "PEM: a file holding the private key and the certificate chain; PKCS12: the "
        "key store file.")] = ""
    ssl_keystore_password: Annotated[str, _doc("Password of a PKCS12 key store.")] = ""
    ssl_keystore_key: Annotated[str, _doc(
        "The PEM private key inline (with ssl.keystore.certificate.chain), instead of a "
        "file.")] = ""
    ssl_keystore_certificate_chain: Annotated[str, _doc(
        "The PEM certificate chain inline, the server's certificate first.")] = ""
    ssl_key_password: Annotated[str, _doc("Password of an encrypted PEM private key.")] = ""
    ssl_truststore_type: Annotated[str, _doc("PEM (client certificates are checked against "
                                             "it).")] = "PEM"
    ssl_truststore_location: Annotated[str, _doc(
        "A PEM file of the certificates trusted to sign client certificates.")] = ""
    ssl_truststore_certificates: Annotated[str, _doc(
        "The trusted PEM certificates inline, instead of a file.")] = ""
    ssl_client_auth: Annotated[str, _doc(
        "none, requested (a client certificate is checked if sent) or required.")] = "none"
    ssl_enabled_protocols: Annotated[str, _doc(
        "TLS versions accepted: TLSv1.2 and/or TLSv1.3.")] = "TLSv1.2,TLSv1.3"
    ssl_cipher_suites: Annotated[str, _doc(
        "TLSv1.2 cipher suites, IANA names as Kafka takes them (or OpenSSL names); empty: "
        "OpenSSL's defaults. TLSv1.3 suites are always OpenSSL's.")] = ""
    ssl_principal_mapping_rules: Annotated[str, _doc(
        "How a client certificate's distinguished name becomes the user name: DEFAULT (the "
        "whole name) and RULE:pattern/replacement/[LU] rules, the first match wins.")] = (
        "DEFAULT")
    sasl_enabled_mechanisms: Annotated[str, _doc(
        "SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (Kafka's default, GSSAPI, is not "
        "supported). Also listener.name.<l>.sasl.enabled.mechanisms. PLAIN users come from "
        "listener.name.<l>.plain.sasl.jaas.config (PlainLoginModule, user_<name>=\"<password>\"); "
        "SCRAM users from AlterUserScramCredentials.")] = "GSSAPI"
    sasl_server_max_receive_size: Annotated[int, _doc(
        "Largest request a SASL listener reads before the client authenticated (larger ones "
        "close the connection): strangers cannot make the broker hold big buffers.",
        ge=64, le=INT_MAX)] = 524288
    connections_max_reauth_ms: Annotated[int, _doc(
        "SASL sessions last this long (KIP-368): the lifetime is told in SaslAuthenticate, the "
        "client re-authenticates on the same connection, and a session left to expire is "
        "closed (reason session_expired). 0: sessions never expire.", ge=0, le=2**63 - 1)] = 0
    connection_failed_authentication_delay_ms: Annotated[int, _doc(
        "A failed authentication is answered at once and its connection closed this much "
        "later (Kafka's defence against password guessing).", ge=0, le=INT_MAX)] = 100
    pybroker_ssl_handshake_timeout_ms: Annotated[int, _doc(
        "A TLS handshake not finished this long after the connection was handed to a worker "
        "closes it (reason tls_handshake_timeout).", ge=100, le=600000)] = 10000
    inter_broker_listener_name: Annotated[str, _doc(
        "Listener for broker-to-broker traffic; defaults to the listener named PLAINTEXT, "
        "else the first listener.")] = ""
    control_plane_listener_name: Annotated[str, _doc(
        "Listener served by a dedicated acceptor and control-plane worker process (KIP-291): "
        "admin and control requests there never queue behind data-plane traffic. Must be in "
        "listeners and differ from inter.broker.listener.name; unset means no control plane.")] = ""
    pybroker_control_plane_queue_size: Annotated[int, _doc(
        "Requests the control-plane worker holds read and not yet answered (KIP-291's "
        "control-plane request queue); at that count it stops reading until one is answered.",
        ge=1, le=10000)] = 20
    pybroker_control_plane_cpu: Annotated[int, _doc(
        "CPU the control-plane worker is pinned to (sched_setaffinity); unset: not pinned.",
        ge=0, le=4095)] | None = None
    pybroker_control_plane_alter_on_data_listeners: Annotated[bool, _doc(
        "With a control plane, also serve config/quota changes and topic creation/deletion on "
        "data listeners (by default they get CLUSTER_AUTHORIZATION_FAILED there).")] = False
    num_network_threads: Annotated[int, _doc(
        "Number of data-plane worker processes.", ge=1, le=64)] = 3
    socket_request_max_bytes: Annotated[int, _doc(
        "Largest request frame accepted; a larger size prefix closes the connection.",
        ge=1, le=INT_MAX)] = 100 * MIB
    socket_listen_backlog_size: Annotated[int, _doc(
        "Kernel accept backlog of each listening socket. Default min(net.core.somaxconn, "
        "4096): Kafka's 50 drops SYNs of a burst while the parent hands off (clients then "
        "retry after 1 s).", ge=1, le=65535)] | None = None
    socket_send_buffer_bytes: Annotated[int, _doc(
        "SO_SNDBUF of accepted sockets; -1 keeps the OS default.", ge=-1)] = 102400
    socket_receive_buffer_bytes: Annotated[int, _doc(
        "SO_RCVBUF of listening sockets (inherited by accepted ones); -1 keeps the OS default.",
        ge=-1)] = 102400
    pybroker_request_max_entries: Annotated[int, _doc(
        "Array elements (topics, partitions, keys, ...) one request may hold in all; more "
        "closes the connection (invalid reason too_many_entries). Each is answered with an "
        "entry that takes about 15 us to encode, so this bounds how long one request holds a "
        "worker.", ge=1000, le=INT_MAX)] = 100_000
    pybroker_forwarded_response_max_bytes: Annotated[int, _doc(
        "Largest answer the parent sends to a request a worker forwards to it (groups, "
        "configs, quotas, SCRAM credentials, ACLs, transactions). Answers that grow with what "
        "the broker holds (DescribeGroups, OffsetFetch, ListGroups, DescribeConfigs, "
        "DescribeAcls, DeleteAcls) are measured before they are built, their entries bounded "
        "by pybroker.request.max.entries too; any other answer is checked once built. Past "
        "the bound the connection that asked is closed (invalid reason response_too_large) "
        "with a log line naming the request; the worker and its other clients are untouched.",
        ge=1 << 20, le=256 << 20)] = 32 * MIB
    pybroker_request_receive_timeout_ms: Annotated[int, _doc(
        "A request whose first bytes arrived this long ago and which is still incomplete "
        "closes its connection (reason receive_timeout): a half-sent request never holds a "
        "connection slot, a buffer or pool memory for ever.", ge=1)] = 30000
    pybroker_proxy_protocol_listeners: Annotated[str, _doc(
        "Comma-separated listener names behind a load balancer that sends the PROXY protocol "
        "(HAProxy's v1 or v2): every connection there must start with a header, from an "
        "address of pybroker.proxy.protocol.trusted.cidrs, and the client's address it carries "
        "is the one limits, rates, ACLs and the event log see.  Empty: off.")] = ""
    pybroker_proxy_protocol_trusted_cidrs: Annotated[str, _doc(
        "Comma-separated CIDRs of the load balancers whose PROXY headers are believed; a "
        "connection from elsewhere on a PROXY listener is closed (proxy_untrusted).")] = ""
    pybroker_proxy_protocol_timeout_ms: Annotated[int, _doc(
        "A PROXY header not whole this long after the connection was accepted closes it "
        "(proxy_timeout).", ge=10)] = 3000
    pybroker_shadow_max_connections: Annotated[bool, _doc(
        "Shadow mode for max.connections and the listeners' max.connections: observe only "
        "(what would have been blocked is counted in broker_connections_rejected_dry_run_"
        "total and logged). Dynamic.")] = False
    pybroker_shadow_connections_per_ip: Annotated[bool, _doc(
        "Shadow mode for max.connections.per.ip and its overrides. Dynamic.")] = False
    pybroker_shadow_connections_per_user: Annotated[bool, _doc(
        "Shadow mode for pybroker.max.connections.per.user and its overrides. Dynamic.")] = False
    pybroker_shadow_connection_creation_rate: Annotated[bool, _doc(
        "Shadow mode for every connection creation rate (broker, listener, IP, user). "
        "Dynamic.")] = False
    pybroker_shadow_client_quotas: Annotated[bool, _doc(
        "Shadow mode for client quotas (byte rates, request percentage): throttles are counted "
        "in broker_throttle_time_dry_run_seconds_total and logged, not applied. The memory "
        "pool's muting has no shadow mode. Dynamic.")] = False
    pybroker_connection_refusal_answer_enable: Annotated[bool, _doc(
        "Answer the first request of a connection refused for max.connections.per.ip: an "
        "ApiVersions gets POLICY_VIOLATION, which clients log, and the connection is closed "
        "pybroker.connection.refusal.delay.ms later (Kafka just closes).")] = True
    pybroker_connection_refusal_delay_ms: Annotated[int, _doc(
        "How long a refused connection is held, unread, after its answer: the client backs "
        "off instead of reconnecting at once.", ge=0, le=INT_MAX)] = 1000
    pybroker_connection_max_unsent_bytes: Annotated[int, _doc(
        "Answers written to a connection and not yet taken by its client beyond this many "
        "bytes close it at once (reason unsent_bytes): a worker never holds more for a client "
        "that does not read.", ge=1 << 20, le=INT_MAX)] = 128 << 20
    pybroker_connection_send_stall_ms: Annotated[int, _doc(
        "A connection with answers waiting to be sent whose client took none of them for this "
        "long is closed (reason send_stalled), freeing its slot and buffers; also the longest "
        "a closing connection waits for its last answers to drain.", ge=100)] = 60000
    pybroker_fetch_max_wait_ms: Annotated[int, _doc(
        "Longest a Fetch long poll waits, whatever max_wait_ms the client asks for.",
        ge=0)] = 30000
    pybroker_request_buffer_keep_bytes: Annotated[int, _doc(
        "Buffers of served requests over 256 KiB (anonymous mappings) each worker keeps for "
        "the next large requests, sparing the page faults of fresh memory; 0 keeps none.",
        ge=0, le=1 << 40)] = 32 << 20
    pybroker_fetch_zero_copy: Annotated[bool, _doc(
        "Fetch answers send record data from the segment files straight to the socket "
        "(os.sendfile), never through Python; TLS listeners copy whatever this says. Off: "
        "records are read into memory and copied.")] = True
    max_incremental_fetch_session_cache_slots: Annotated[int, _doc(
        "Incremental fetch sessions (KIP-227) the broker keeps at once, shared fairly by the "
        "workers; 0 disables them (every fetch is a full one).", ge=0, le=INT_MAX)] = 1000
    pybroker_incremental_fetch_session_cache_partitions: Annotated[int, _doc(
        "Partitions all fetch sessions together may remember, broker-wide (an even share per "
        "worker; about 250 bytes each); a session that would pass it evicts another as a new "
        "session may, or is refused.", ge=1000, le=INT_MAX)] = 1_000_000
    pybroker_incremental_fetch_session_eviction_ms: Annotated[int, _doc(
        "A fetch session unused this long may be evicted by any new one, and one older than "
        "this by a new one with more partitions (Kafka's fixed 120 s).", ge=1)] = 120000
    connections_max_idle_ms: Annotated[int, _doc(
        "Close connections idle for longer than this; -1 disables idle expiry.", ge=-1)] = 600000
    log_dirs: Annotated[str, _doc(
        "Comma-separated data directories; the first also holds the broker's lock and "
        "runtime files. Defaults to log.dir.")] = ""
    log_dir: Annotated[str, _doc("Data directory used when log.dirs is not set.")] = "/tmp/kafka-logs"
    max_connections: Annotated[int, _doc(
        "Connections the broker accepts in all (the inter-broker listener may exceed it when "
        "there are several listeners; others' least recently used connections are then "
        "closed). Also `listener.name.<l>.max.connections`. Dynamic.", ge=0, le=INT_MAX)] = INT_MAX
    max_connections_per_ip: Annotated[int, _doc(
        "Connections one IP address may hold; 0 needs overrides. Dynamic.",
        ge=0, le=INT_MAX)] = INT_MAX
    max_connections_per_ip_overrides: Annotated[str, _doc(
        "Comma-separated host:N, ip:N or cidr:N (most specific wins; host names resolved at "
        "start-up and on every change). Dynamic.")] = ""
    max_connection_creation_rate: Annotated[int, _doc(
        "New connections per second, broker-wide (the inter-broker listener is exempt). Also "
        "`listener.name.<l>.max.connection.creation.rate`. Dynamic.", ge=0, le=INT_MAX)] = INT_MAX
    max_connection_creation_rate_per_ip: Annotated[int, _doc(
        "Default connection_creation_rate quota of each IP (an `ip` entity quota wins); a "
        "socket over it is closed after the throttle delay, unread.", ge=0, le=INT_MAX)] = INT_MAX
    authorizer_class_name: Annotated[str, _doc(
        "Turns ACL authorization on: org.apache.kafka.metadata.authorizer.StandardAuthorizer or "
        "kafka.security.authorizer.AclAuthorizer (both mean the same here). Empty: every "
        "request is allowed.")] = ""
    super_users: Annotated[str, _doc(
        "Principals allowed everything, whatever the ACLs: User:admin;User:ops.")] = ""
    allow_everyone_if_no_acl_found: Annotated[bool, _doc(
        "With the authorizer on, allow an operation on a resource that has no ACL at all.")] = False
    pybroker_max_connections_per_user: Annotated[int, _doc(
        "Connections one principal (a SASL user, or a client certificate's mapped name) may "
        "hold on the data listeners, counted across all workers once it authenticated; "
        "User:ANONYMOUS is not limited. Over it, the authentication fails and the connection "
        "closes after connection.failed.authentication.delay.ms. Dynamic.",
        ge=0, le=INT_MAX)] = INT_MAX
    pybroker_max_connections_per_user_overrides: Annotated[str, _doc(
        "Comma-separated user:N (a name may hold ':', not ',': shorten certificate names with "
        "ssl.principal.mapping.rules), each user's own limit instead of "
        "pybroker.max.connections.per.user. Dynamic.")] = ""
    pybroker_max_connection_creation_rate_per_user: Annotated[int, _doc(
        "Authenticated connections per second one principal may open on the data listeners; "
        "over it, as for the count (reason per_user_rate). Dynamic.", ge=0, le=INT_MAX)] = INT_MAX
    pybroker_max_connection_creation_rate_per_user_overrides: Annotated[str, _doc(
        "Comma-separated user:N, each user's own rate instead of "
        "pybroker.max.connection.creation.rate.per.user. Dynamic.")] = ""
    quota_window_num: Annotated[int, _doc(
        "Samples kept by every rate quota.", ge=1, le=32)] = 11
    quota_window_size_seconds: Annotated[int, _doc(
        "Length of one rate sample.", ge=1, le=3600)] = 1
    pybroker_quota_burst_windows: Annotated[int, _doc(
        "Initial burst of a fresh rate quota, in windows: limit x this x window size events "
        "pass at once (a client quota's full bucket holds as much). Default quota.window.num "
        "- 1, as Kafka.", ge=0, le=999)] | None = None
    queued_max_request_bytes: Annotated[int, _doc(
        "Bytes all workers together may hold for requests being read or served (KIP-72); "
        "-1 or 0 disables the pool. At least socket.request.max.bytes.", ge=-1)] = -1
    queued_max_requests: Annotated[int, _doc(
        "Requests read and not yet answered, broker-wide (split evenly over the workers); a "
        "worker at its share stops reading new requests until one is answered.", ge=1)] = 500
    pybroker_pool_max_waiters: Annotated[int, _doc(
        "Requests that may wait for pool memory at once on one listener; past it a request's "
        "connection is closed (reason pool_queue_full).", ge=16, le=1 << 20)] = 4096
    pybroker_queued_max_request_bytes_reserved: Annotated[str, _doc(
        "LISTENER:bytes,... parts of queued.max.request.bytes only requests on that listener "
        "may use, so clients exhausting the pool cannot starve it. The control-plane listener "
        "gets min(1 MiB, pool / 4) unless named here.")] = ""
    quota_producer_default: Annotated[int, _doc(
        "producer_byte_rate of every client-id with no quota of its own (Kafka's old static "
        "default; AlterClientQuotas values win).", ge=1)] | None = None
    quota_consumer_default: Annotated[int, _doc(
        "consumer_byte_rate of every client-id with no quota of its own.", ge=1)] | None = None
    pybroker_quota_request_percentage_default: Annotated[int, _doc(
        "request_percentage of every client-id with no quota of its own (100 = one worker's "
        "handler time).", ge=1)] | None = None
    pybroker_quota_max_sensors: Annotated[int, _doc(
        "Client quota sensors (user/client-id) tracked at once, broker-wide. A sensor idle for "
        "a whole rate span is reused; with all in use a new client is not held to its quota "
        "until one frees up (broker_quota_untracked_requests_total counts it).",
        ge=16, le=1 << 20)] = 4096
    pybroker_quota_max_throttle_ms: Annotated[int, _doc(
        "Cap on one throttle: Kafka's byte-rate throttles are uncapped and push clients into "
        "request timeouts. A client quota debt beyond it and one rate span is forgiven.",
        ge=1)] = 10000
    pybroker_quota_exempt_client_ids: Annotated[str, _doc(
        "Comma-separated client ids never throttled by client quotas.")] = ""
    auto_create_topics_enable: Annotated[bool, _doc(
        "Create a topic when a client asks Metadata for an unknown one.")] = True
    num_partitions: Annotated[int, _doc(
        "Partitions of an auto-created topic, or of CreateTopics with -1.", ge=1, le=10000)] = 1
    pybroker_max_partitions_per_topic: Annotated[int, _doc(
        "Most partitions CreateTopics may give one topic (more gets INVALID_PARTITIONS).",
        ge=1, le=1_000_000)] = 10000
    default_replication_factor: Annotated[int, _doc(
        "Replication factor of new topics; this broker is a single node, so 1.", ge=1, le=1)] = 1
    message_max_bytes: Annotated[int, _doc(
        "Largest record batch accepted by Produce.", ge=0, le=INT_MAX)] = 1048588
    log_message_timestamp_before_max_ms: Annotated[int, _doc(
        "A record stamped (CreateTime) further in the past than this is refused with "
        "INVALID_TIMESTAMP.", ge=0)] = 2**63 - 1
    log_message_timestamp_after_max_ms: Annotated[int, _doc(
        "A record stamped (CreateTime) further in the future than this is refused with "
        "INVALID_TIMESTAMP.", ge=0)] = 2**63 - 1
    pybroker_max_decompressed_batch_bytes: Annotated[int, _doc(
        "A compressed batch is decompressed to validate its records, at most to this many "
        "bytes; one that expands further is refused (CORRUPT_MESSAGE).",
        ge=1 << 20, le=1 << 31)] = 32 << 20
    producer_id_expiration_ms: Annotated[int, _doc(
        "An idempotent producer's state (to recognise its retries) is kept this long after its "
        "last write.", ge=1)] = 86_400_000
    pybroker_max_producers_per_partition: Annotated[int, _doc(
        "Idempotent producers one partition remembers at once (the table grows to this); past "
        "it the least recently used is forgotten.", ge=64)] = 100_000
    log_segment_bytes: Annotated[int, _doc(
        "A partition's active segment is rolled past this size.", ge=14, le=INT_MAX)] = 1 << 30
    log_index_interval_bytes: Annotated[int, _doc(
        "Bytes of batches between two offset-index entries.", ge=0, le=INT_MAX)] = 4096
    log_retention_bytes: Annotated[int, _doc(
        "Per partition: oldest segments are deleted while the log exceeds this; -1 = no limit.",
        ge=-1)] = -1
    log_retention_ms: Annotated[int, _doc(
        "Segments older than this are deleted; -1 = no limit. Wins over minutes and hours.",
        ge=-1)] | None = None
    log_retention_minutes: Annotated[int, _doc(
        "As log.retention.ms, in minutes; wins over hours.", ge=-1)] | None = None
    log_retention_hours: Annotated[int, _doc(
        "As log.retention.ms, in hours.", ge=-1)] = 168
    log_cleanup_policy: Annotated[str, _doc(
        "Default cleanup.policy of topics: delete, compact or both (comma-separated). A "
        "compact-only topic's segments are not deleted by retention.")] = "delete"
    log_message_timestamp_type: Annotated[str, _doc(
        "Default message.timestamp.type of topics: CreateTime (the producer's) or LogAppendTime "
        "(the broker's clock at append).")] = "CreateTime"
    log_roll_ms: Annotated[int, _doc(
        "Default segment.ms of topics: a segment whose first batch came this long ago rolls "
        "at the next append.",
        ge=1)] = 604_800_000
    log_cleaner_enable: Annotated[bool, _doc(
        "Run the log cleaner (compaction of topics whose cleanup.policy has compact) in the "
        "parent.")] = True
    log_cleaner_backoff_ms: Annotated[int, _doc(
        "Pause between two compaction rounds.", ge=10)] = 15000
    log_cleaner_io_max_bytes_per_second: Annotated[int, _doc(
        "Bytes per second the cleaner may write; unset: no limit.", ge=1)] | None = None
    log_cleaner_min_compaction_lag_ms: Annotated[int, _doc(
        "Default min.compaction.lag.ms of topics.", ge=0)] = 0
    log_cleaner_delete_retention_ms: Annotated[int, _doc(
        "Default delete.retention.ms of topics (how long compaction keeps tombstones).",
        ge=0)] = 86_400_000
    log_cleaner_min_cleanable_ratio: Annotated[float, _doc(
        "Default min.cleanable.dirty.ratio of topics.", ge=0, le=1)] = 0.5
    compression_type: Annotated[str, _doc(
        "Default compression.type of topics: uncompressed, zstd, lz4, snappy or gzip (batches "
        "are stored in that codec, one in another recompressed at append), or producer (kept "
        "as produced).")] = "producer"
    compression_gzip_level: Annotated[int, _doc(
        "Default compression.gzip.level of topics: 1 to 9, or -1 (zlib's default, 6).",
        ge=-1, le=9)] = -1
    compression_lz4_level: Annotated[int, _doc(
        "Default compression.lz4.level of topics: 9 is lz4's fast mode, any other its "
        "high-compression mode.", ge=1, le=17)] = 9
    compression_zstd_level: Annotated[int, _doc(
        "Default compression.zstd.level of topics.", ge=-131072, le=22)] = 3
    min_insync_replicas: Annotated[int, _doc(
        "Default min.insync.replicas of topics; as Kafka, acks=all waits for "
        "min(min.insync.replicas, replicas) in-sync replicas: here one, this broker.",
        ge=1)] = 1
    log_retention_check_interval_ms: Annotated[int, _doc(
        "How often the parent looks for segments to delete.", ge=1)] = 300000
    log_flush_interval_messages: Annotated[int, _doc(
        "fsync a partition once this many messages were appended since its last fsync.",
        ge=1)] = 2**63 - 1
    log_flush_interval_ms: Annotated[int, _doc(
        "fsync every partition with unflushed messages this often (unset: never by time).",
        ge=1)] | None = None
    group_min_session_timeout_ms: Annotated[int, _doc(
        "Smallest session.timeout.ms a consumer group member may ask for.", ge=1)] = 6000
    group_max_session_timeout_ms: Annotated[int, _doc(
        "Largest session.timeout.ms a consumer group member may ask for.", ge=1)] = 1800000
    group_initial_rebalance_delay_ms: Annotated[int, _doc(
        "How long the first rebalance of an empty group waits for more members to join.",
        ge=0)] = 3000
    pybroker_group_max_members: Annotated[int, _doc(
        "Members (pending ones included) all consumer groups together may have; a JoinGroup "
        "past it gets GROUP_MAX_SIZE_REACHED.", ge=1)] = 100_000
    pybroker_group_max_pending_members: Annotated[int, _doc(
        "Member ids handed out with MEMBER_ID_REQUIRED and not yet used to join, kept in all; "
        "past it the oldest is forgotten (its client joins again from the start).",
        ge=1)] = 10_000
    group_max_size: Annotated[int, _doc(
        "Members one consumer group may have.", ge=1, le=INT_MAX)] = INT_MAX
    offsets_retention_minutes: Annotated[int, _doc(
        "Committed offsets of a group that has been empty this long are deleted.",
        ge=1)] = 10080
    offsets_retention_check_interval_ms: Annotated[int, _doc(
        "How often expired committed offsets are looked for.", ge=1)] = 600000
    transaction_max_timeout_ms: Annotated[int, _doc(
        "The largest transaction.timeout.ms a transactional producer may ask for "
        "(InitProducerId answers INVALID_TRANSACTION_TIMEOUT above it).", ge=1)] = 900_000
    pybroker_max_transactional_ids: Annotated[int, _doc(
        "Transactional ids the coordinator keeps at once.  A new one past it takes the place "
        "of the least recently used id with no transaction in progress of the principal "
        "holding the most; with every id in a transaction, InitProducerId answers "
        "COORDINATOR_NOT_AVAILABLE (retriable).", ge=1)] = 100_000
    pybroker_max_transactional_ids_per_principal: Annotated[int, _doc(
        "Transactional ids one principal may hold (for ANONYMOUS: one client address); "
        "unset: a tenth of pybroker.max.transactional.ids.  At it, a new id takes the place "
        "of the principal's own least recently used id with no transaction in progress; with "
        "all of them in a transaction, InitProducerId answers COORDINATOR_NOT_AVAILABLE "
        "(retriable) while other principals still get ids.", ge=1)] | None = None
    pybroker_max_partitions_per_transaction: Annotated[int, _doc(
        "Partitions one transaction may span: what one transactional id holds in memory and "
        "each line of the transaction log carries; AddPartitionsToTxn past it answers "
        "INVALID_REQUEST (the producer aborts that transaction).", ge=1)] = 10_000
    transactional_id_expiration_ms: Annotated[int, _doc(
        "A transactional id with no transaction in progress is forgotten this long after its "
        "last use.", ge=1)] = 604_800_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: Annotated[int, _doc(
        "How often transactions open longer than their timeout are looked for (and aborted, "
        "the producer's epoch bumped).", ge=1)] = 10_000
    transaction_remove_expired_transaction_cleanup_interval_ms: Annotated[int, _doc(
        "How often transactional ids past transactional.id.expiration.ms are looked for.",
        ge=1)] = 3_600_000
    offset_metadata_max_bytes: Annotated[int, _doc(
        "Largest metadata string an OffsetCommit may attach to an offset.", ge=0)] = 4096
    pybroker_event_log_enable: Annotated[bool, _doc(
        "Write the structured event log (broker/shared/events.py), the input of the PySpark "
        "pipeline.")] = True
    pybroker_event_log_dir: Annotated[str, _doc(
        "Directory of the event log; default: pybroker-events beside the first log dir.")] = ""
    pybroker_event_log_file_bytes: Annotated[int, _doc(
        "Each process starts a new event file past this size.", ge=4096, le=2**40)] = 64 * MIB
    pybroker_event_log_total_bytes: Annotated[int, _doc(
        "Cap on the event log directory: the oldest closed files are deleted past it.",
        ge=4096, le=2**50)] = 1024 * MIB
    pybroker_event_log_slow_request_ms: Annotated[int, _doc(
        "Requests slower than this are also logged one by one (others only per second).",
        ge=0, le=INT_MAX)] = 100
    prometheus_listen: Annotated[str, _doc(
        "HOST:PORT of the Prometheus /metrics endpoint; empty disables it.")] = "127.0.0.1:9404"
    pybroker_handoff_queue_size: Annotated[int, _doc(
        "Connections handed to one worker and not yet registered by it (KIP-402's queue).",
        ge=1, le=10000)] = 20
    pybroker_registrations_per_turn: Annotated[int, _doc(
        "New connections a worker registers per event-loop turn before serving existing ones.",
        ge=1, le=10000)] = 20
    pybroker_shutdown_timeout_ms: Annotated[int, _doc(
        "On SIGTERM, how long in-flight requests may finish before workers are killed.",
        ge=0, le=600000)] = 10000
    pybroker_worker_heartbeat_timeout_ms: Annotated[int, _doc(
        "A worker whose heartbeat is older than this is aborted, then killed.",
        ge=1000, le=3600000)] = 30000


def retention_ms(props: ServerProperties) -> int:
    """Kafka's precedence: log.retention.ms, then minutes, then hours; -1 means forever."""
    if props.log_retention_ms is not None:
        return props.log_retention_ms
    if props.log_retention_minutes is not None:
        return -1 if props.log_retention_minutes < 0 else props.log_retention_minutes * 60000
    return -1 if props.log_retention_hours < 0 else props.log_retention_hours * 3600000


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
_LISTENER_KEY = re.compile(r"listener\.name\.([A-Za-z0-9_]+)\.(.+)")  # matched whole


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


# --- .properties syntax --------------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _logical_lines(text: str):
    """Yield (line number, logical line), joining lines that end in an odd number of '\\'."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending, start = pending + line[:-1], start or number
            continue
        yield (start or number), pending + line
        pending, start = "", 0
    if pending:
        yield start, pending


_SEPARATOR = re.compile(r"(?<!\\)(\s*[=:]\s*|\s+)")


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `.properties` text: comments, `=`/`:`/space separators, continuations."""
    result: dict[str, str] = {}
    for _number, line in _logical_lines(text):
        match = _SEPARATOR.search(line)
        if match is None:
            key, value = line, ""
        else:
            key, value = line[:match.start()], line[match.end():]
        result[_unescape(key)] = _unescape(value)
    return result


def read_properties_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_properties(handle.read())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {pair!r}: expected key=value")
        result[key.strip()] = value.strip()
    return result


# --- validation ----------------------------------------------------------------------------

_KEYS = {field.encode_name: field for field in msgspec.structs.fields(ServerProperties)}
# Both matched whole (fullmatch): "$" would also match before a trailing newline.
_LISTENER_RE = re.compile(r"([A-Za-z0-9_]+)://\[?([0-9a-zA-Z\-%._:]*?)\]?:(-?[0-9]+)")
_MSGSPEC_PATH = re.compile(r" - at `\$\.(.+?)`$")


def declared_keys() -> list[msgspec.structs.FieldInfo]:
    return list(_KEYS.values())


def _convert(raw: dict[str, str]) -> ServerProperties:
    for key in raw:
        if key not in _KEYS:
            raise ConfigError(f"{key}: unknown configuration key")
    try:
        return msgspec.convert(raw, ServerProperties, strict=False)
    except msgspec.ValidationError as error:
        message = str(error)
        match = _MSGSPEC_PATH.search(message)
        if match is None:
            raise ConfigError(message) from None
        key = match.group(1)
        reason = message[:match.start()].replace("`", "")
        raise ConfigError(f"{key}: invalid value {raw.get(key)!r} ({reason.lower()})") from None


def _split_csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_protocol_map(value: str) -> dict[str, str]:
    result = {}
    for item in _split_csv(value):
        name, sep, protocol = item.partition(":")
        if not sep or not name or not protocol:
            raise ConfigError(f"listener.security.protocol.map: invalid entry {item!r} "
                              "(expected LISTENER:PROTOCOL)")
        if protocol.upper() not in KNOWN_PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: unknown security protocol "
                              f"{protocol!r} for listener {name}")
        if name.upper() in result:
            raise ConfigError(f"listener.security.protocol.map: listener {name} appears twice")
        result[name.upper()] = protocol.upper()
    return result


def _parse_listeners(key: str, value: str, protocols: dict[str, str]) -> tuple[Listener, ...]:
    listeners: list[Listener] = []
    for item in _split_csv(value):
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
        if protocol not in SUPPORTED_PROTOCOLS:
            raise ConfigError(f"{key}: listener {name} uses {protocol}, which is not supported "
                              "yet")
        if any(existing.name == name for existing in listeners):
            raise ConfigError(f"{key}: listener name {name} appears more than once")
        listeners.append(Listener(name=name, host=host, port=port, protocol=protocol))
    if not listeners:
        raise ConfigError(f"{key}: at least one listener is required")
    return tuple(listeners)


def _check_distinct_ports(listeners: tuple[Listener, ...]) -> None:
    seen: dict[int, str] = {}
    for listener in listeners:
        if listener.port and listener.port in seen:
            raise ConfigError(f"listeners: {listener.name} and {seen[listener.port]} share "
                              f"port {listener.port}; each listener needs its own port")
        seen[listener.port] = listener.name


def _resolve_advertised(props: ServerProperties, listeners, protocols) -> tuple[Listener, ...]:
    if not props.advertised_listeners:
        return listeners
    advertised = _parse_listeners("advertised.listeners", props.advertised_listeners, protocols)
    names = {listener.name for listener in listeners}
    for listener in advertised:
        if listener.name not in names:
            raise ConfigError(f"advertised.listeners: listener {listener.name} is not in "
                              "listeners")
        if listener.host in ("0.0.0.0", "::"):
            raise ConfigError(f"advertised.listeners: {listener.name} advertises the "
                              f"non-routable address {listener.host}")
    return advertised


def _resolve_node_id(props: ServerProperties) -> int:
    if props.node_id is not None and props.broker_id is not None and props.node_id != props.broker_id:
        raise ConfigError(f"node.id: {props.node_id} differs from broker.id {props.broker_id}")
    if props.node_id is not None:
        return props.node_id
    return props.broker_id if props.broker_id is not None else 0


def _resolve_inter_broker(props: ServerProperties, listeners) -> str:
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


def _resolve_control_plane(props: ServerProperties, protocols: dict[str, str], listeners,
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


def _parse_host_port(key: str, value: str) -> tuple[str, int] | None:
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: invalid address {value!r} (expected HOST:PORT)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _sasl_settings(props: ServerProperties, per_listener: dict[str, dict[str, str]],
                   listeners) -> dict[str, SaslSettings]:
    """Every SASL listener's mechanisms and PLAIN users; a bad or missing key names itself."""
    result = {}
    for listener in listeners:
        if listener.protocol not in SASL_PROTOCOLS:
            continue
        own = per_listener.get(listener.name, {})
        prefix = f"listener.name.{listener.name.lower()}."
        key = "sasl.enabled.mechanisms"
        named = prefix + key if key in own else key
        mechanisms = tuple(item.strip().upper()
                           for item in own.get(key, props.sasl_enabled_mechanisms).split(",")
                           if item.strip())
        unknown = [item for item in mechanisms if item not in MECHANISMS]
        if unknown or not mechanisms:
            raise ConfigError(f"{named}: {', '.join(unknown) or 'nothing'} for SASL listener "
                              f"{listener.name} (supported: {', '.join(MECHANISMS)})")
        users = {}
        if "PLAIN" in mechanisms:
            jaas_key = prefix + "plain.sasl.jaas.config"
            if "plain.sasl.jaas.config" not in own:
                raise ConfigError(f"{jaas_key}: required for PLAIN on listener {listener.name}")
            try:
                users = plain_users(own["plain.sasl.jaas.config"])
            except ValueError as error:
                raise ConfigError(f"{jaas_key}: {error}") from None
        result[listener.name] = SaslSettings(listener.name, mechanisms, users)
    return result


def _split_listener_keys(raw: dict[str, str]):
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


def _tls_settings(props: ServerProperties, per_listener: dict[str, dict[str, str]],
                  listeners) -> dict[str, TlsSettings]:
    """Every TLS listener's settings, each checked by building its context once."""
    names = {listener.name for listener in listeners}
    for name in per_listener:
        if name not in names:
            raise ConfigError(f"listener.name.{name.lower()}.ssl.*: listener {name} is not in "
                              "listeners")
    result = {}
    for listener in listeners:
        if listener.protocol not in TLS_PROTOCOLS:
            continue
        values = {key: getattr(props, key.replace(".", "_")) for key in TLS_KEYS}
        values = {key: value for key, value in values.items() if value}
        own = {key: value for key, value in per_listener.get(listener.name, {}).items()
               if key in TLS_KEYS}
        settings = TlsSettings(listener.name, {**values, **own}, frozenset(own))
        try:
            server_context(settings)
            PrincipalRules(settings.get("ssl.principal.mapping.rules", "DEFAULT"))
        except TlsConfigError as error:
            raise ConfigError(str(error)) from None
        except ValueError as error:
            raise ConfigError(f"{settings.name_of('ssl.principal.mapping.rules')}: "
                              f"{error}") from None
        result[listener.name] = settings
    return result


def _convert_listener_keys(per_listener: dict[str, dict[str, str]], listeners) -> dict:
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
    policy = [item.strip() for item in props.log_cleanup_policy.split(",") if item.strip()]
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


CONTROL_PLANE_RESERVE = MIB


def _parse_pool_reservations(props: ServerProperties, listeners,
                             control_plane: str | None) -> dict[str, int]:
    key = "pybroker.queued.max.request.bytes.reserved"
    pool = props.queued_max_request_bytes
    if pool > 0 and pool < props.socket_request_max_bytes:
        raise ConfigError(f"queued.max.request.bytes: {pool} is smaller than "
                          f"socket.request.max.bytes {props.socket_request_max_bytes}")
    reserved: dict[str, int] = {}
    names = {listener.name for listener in listeners}
    for item in _split_csv(props.pybroker_queued_max_request_bytes_reserved):
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


def load_config(raw: dict[str, str]) -> BrokerConfig:
    """Validate raw key/value pairs into a BrokerConfig, or raise ConfigError."""
    raw, per_listener, per_listener_tls = _split_listener_keys(raw)
    props = _convert(raw)
    _check_quota_settings(props)
    _check_topic_defaults(props)
    if props.group_min_session_timeout_ms > props.group_max_session_timeout_ms:
        raise ConfigError(f"group.min.session.timeout.ms: {props.group_min_session_timeout_ms} "
                          f"is more than group.max.session.timeout.ms "
                          f"{props.group_max_session_timeout_ms}")
    protocols = _parse_protocol_map(props.listener_security_protocol_map)
    listeners = _parse_listeners("listeners", props.listeners, protocols)
    _check_distinct_ports(listeners)
    log_dirs = tuple(_split_csv(props.log_dirs or props.log_dir))
    if not log_dirs:
        raise ConfigError("log.dirs: at least one directory is required")
    advertised = _resolve_advertised(props, listeners, protocols)
    inter_broker = _resolve_inter_broker(props, listeners)
    control_plane = _resolve_control_plane(props, protocols, listeners, advertised, inter_broker)
    return BrokerConfig(
        props=props,
        listener_props=_convert_listener_keys(per_listener, listeners),
        listener_tls=_tls_settings(props, per_listener_tls, listeners),
        listener_sasl=_sasl_settings(props, per_listener_tls, listeners),
        pool_reserved=_parse_pool_reservations(props, listeners, control_plane),
        node_id=_resolve_node_id(props),
        listeners=listeners,
        advertised=advertised,
        inter_broker_listener=inter_broker,
        control_plane_listener=control_plane,
        log_dirs=log_dirs,
        prometheus=_parse_host_port("prometheus.listen", props.prometheus_listen),
        event_log_dir=_event_log_dir(props, log_dirs),
        super_users=_check_authorizer(props),
        proxy_listeners=_proxy_listeners(props, listeners),
    )


def _proxy_listeners(props: ServerProperties, listeners) -> frozenset[str]:
    names = frozenset(name.upper() for name in _split_csv(props.pybroker_proxy_protocol_listeners))
    unknown = names - {listener.name for listener in listeners}
    if unknown:
        raise ConfigError(f"pybroker.proxy.protocol.listeners: no listener named "
                          f"{', '.join(sorted(unknown))}")
    cidrs = _split_csv(props.pybroker_proxy_protocol_trusted_cidrs)
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


def describe_keys() -> str:
    """The key table printed by `python -m broker --describe-config` and shown in the README."""
    lines = ["| key | type | default | doc |", "|---|---|---|---|"]
    for field in declared_keys():
        metas = _metas(field.type)
        bounds = ""
        if metas and (metas[0].ge is not None or metas[0].le is not None):
            low = "" if metas[0].ge is None else metas[0].ge
            high = "" if metas[0].le is None else metas[0].le
            bounds = f" [{low}..{high}]"
        default = "" if field.default is None else repr(field.default)
        doc = key_doc(field.encode_name)
        lines.append(f"| `{field.encode_name}` | {_type_name(field.type)}{bounds} | {default} | {doc} |")
    return "\n".join(lines)


def key_doc(key: str) -> str:
    """A declared key's doc string ("" for a key not declared)."""
    field = _KEYS.get(key)
    if field is None:
        return ""
    return next((meta.description for meta in _metas(field.type) if meta.description), "")


def _metas(annotation) -> list[Meta]:
    found = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Meta)]
    for arg in getattr(annotation, "__args__", ()):
        found.extend(_metas(arg))
    return found


def _type_name(annotation) -> str:
    if getattr(annotation, "__metadata__", None) is not None:
        return _type_name(annotation.__origin__)
    members = [arg for arg in getattr(annotation, "__args__", ()) if arg is not type(None)]
    if members:
        return _type_name(members[0])
    return {int: "int", bool: "boolean", str: "string"}.get(annotation, str(annotation))
