"""The key catalogue: every configuration key this broker understands, declared once.

Each key is one field of `ServerProperties`, with its type, default, bounds and doc string
(the field name with `_` read as `.` is the Kafka key).  `server_properties` has msgspec
convert and bounds-check the raw strings into that struct; `declared_keys` and `key_doc` tell
the rest of the broker (dynamic configs, DescribeConfigs, `--describe-config`) what is
declared.  Also here: `ConfigError`, what every configuration check raises, and
`retention_ms`, Kafka's precedence among the three retention keys.

Pure: nothing here reads a file, the system or the network.

Keys that are not Kafka's carry the prefix `pybroker.`, except `prometheus.listen`.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from msgspec import Meta

from broker.shared.constants import INT_MAX

MIB = 1024 * 1024
SERVER_ASSIGNORS = ("uniform", "range")  # what group.consumer.assignors may name


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
    pybroker_upstream_bootstrap_servers: Annotated[str, _doc(
        "Comma-separated host:port of an Apache Kafka cluster this broker stands before as a "
        "front-end: it keeps no log of its own, and after its own checks every request goes "
        "to the upstream broker that must answer it.  Empty: a broker with its own log.")] = ""
    pybroker_upstream_security_protocol: Annotated[str, _doc(
        "How the front-end reaches the upstream cluster, as Kafka's clients say it: "
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")] = "PLAINTEXT"
    pybroker_upstream_sasl_mechanism: Annotated[str, _doc(
        "The front-end's SASL mechanism toward the upstream: PLAIN, SCRAM-SHA-256 or "
        "SCRAM-SHA-512.")] = "PLAIN"
    pybroker_upstream_sasl_username: Annotated[str, _doc(
        "The front-end's own user at the upstream (every link authenticates as it).")] = ""
    pybroker_upstream_sasl_password: Annotated[str, _doc(
        "That user's password; never shown by DescribeConfigs.")] = ""
    pybroker_upstream_ssl_ca_location: Annotated[str, _doc(
        "PEM file of the CAs the upstream's certificates are checked against; empty: the "
        "system's.")] = ""
    pybroker_upstream_ssl_endpoint_identification_algorithm: Annotated[str, _doc(
        "https: the upstream's certificate must name the host connected to; empty: not "
        "checked.")] = "https"
    pybroker_frontend_node_port_base: Annotated[int, _doc(
        "Front-end mode: upstream node n is reached through port base + i * "
        "pybroker.frontend.node.ports.per.listener + n of the i-th listener (in `listeners` "
        "order), advertised with that listener's host; required with "
        "pybroker.upstream.bootstrap.servers.", ge=0, le=65535)] = 0
    pybroker_frontend_node_ports_per_listener: Annotated[int, _doc(
        "Front-end mode: the ports each listener reserves for upstream nodes, so node ids "
        "from 0 to this - 1 can be served.", ge=1, le=10000)] = 100
    pybroker_upstream_max_connections_per_node: Annotated[int, _doc(
        "Front-end mode: connections one worker may hold open to one upstream node; a "
        "request that finds them all busy waits for one.", ge=1, le=10000)] = 32
    pybroker_upstream_idle_ms: Annotated[int, _doc(
        "Front-end mode: an upstream connection unused this long is closed (below Kafka's "
        "connections.max.idle.ms of 600000, so the front-end closes first).",
        ge=1000, le=590000)] = 300000
    pybroker_upstream_metadata_refresh_ms: Annotated[int, _doc(
        "Front-end mode: how often the parent asks the upstream cluster for its nodes, API "
        "versions and features (a new node gets its ports at the next look).",
        ge=100, le=INT_MAX)] = 5000
    pybroker_upstream_request_timeout_ms: Annotated[int, _doc(
        "Front-end mode: an upstream answer not back this long after its request (beyond a "
        "Fetch's long poll; JoinGroup, SyncGroup and ShareFetch get 15 minutes) closes that "
        "upstream connection and the client's (reason upstream).", ge=1000,
        le=INT_MAX)] = 30000
    pybroker_upstream_connect_timeout_ms: Annotated[int, _doc(
        "Front-end mode: an upstream connection not made this long fails; the client's "
        "connection is closed (reason upstream) and its client looks elsewhere.",
        ge=100, le=INT_MAX)] = 5000
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
    group_consumer_heartbeat_interval_ms: Annotated[int, _doc(
        "How often members of consumer groups (the KIP-848 protocol, group.protocol=consumer) "
        "heartbeat: the interval every ConsumerGroupHeartbeat answer gives.", ge=1)] = 5000
    group_consumer_min_heartbeat_interval_ms: Annotated[int, _doc(
        "Smallest group.consumer.heartbeat.interval.ms allowed.", ge=1)] = 5000
    group_consumer_max_heartbeat_interval_ms: Annotated[int, _doc(
        "Largest group.consumer.heartbeat.interval.ms allowed.", ge=1)] = 15000
    group_consumer_session_timeout_ms: Annotated[int, _doc(
        "A member of a consumer group (KIP-848) that does not heartbeat for this long is "
        "removed and its partitions are assigned to others.", ge=1)] = 45000
    group_consumer_min_session_timeout_ms: Annotated[int, _doc(
        "Smallest group.consumer.session.timeout.ms allowed.", ge=1)] = 45000
    group_consumer_max_session_timeout_ms: Annotated[int, _doc(
        "Largest group.consumer.session.timeout.ms allowed.", ge=1)] = 60000
    group_consumer_max_size: Annotated[int, _doc(
        "Members one consumer group of the KIP-848 protocol may have; a member joining past "
        "it gets GROUP_MAX_SIZE_REACHED.", ge=1, le=INT_MAX)] = INT_MAX
    group_consumer_assignors: Annotated[str, _doc(
        "The server-side assignors consumer groups (KIP-848) may use, comma-separated, the "
        "first being the default: uniform (balanced and sticky) and range.")] = "uniform,range"
    group_share_heartbeat_interval_ms: Annotated[int, _doc(
        "How often members of share groups (KIP-932) heartbeat.", ge=1)] = 5000
    group_share_min_heartbeat_interval_ms: Annotated[int, _doc(
        "Smallest group.share.heartbeat.interval.ms allowed.", ge=1)] = 5000
    group_share_max_heartbeat_interval_ms: Annotated[int, _doc(
        "Largest group.share.heartbeat.interval.ms allowed.", ge=1)] = 15000
    group_share_session_timeout_ms: Annotated[int, _doc(
        "A member of a share group that does not heartbeat for this long is removed; the "
        "records it holds are delivered to others.", ge=1)] = 45000
    group_share_min_session_timeout_ms: Annotated[int, _doc(
        "Smallest group.share.session.timeout.ms allowed.", ge=1)] = 45000
    group_share_max_session_timeout_ms: Annotated[int, _doc(
        "Largest group.share.session.timeout.ms allowed.", ge=1)] = 60000
    group_share_max_size: Annotated[int, _doc(
        "Members one share group may have.", ge=1, le=1000)] = 200
    group_share_record_lock_duration_ms: Annotated[int, _doc(
        "How long a member holds a record of a share group it was given before the record "
        "goes back to be delivered again.", ge=1000, le=3600000)] = 30000
    group_share_min_record_lock_duration_ms: Annotated[int, _doc(
        "Smallest group.share.record.lock.duration.ms allowed, and smallest "
        "share.record.lock.duration.ms a share group may set for itself.",
        ge=1000, le=30000)] = 15000
    group_share_max_record_lock_duration_ms: Annotated[int, _doc(
        "Largest group.share.record.lock.duration.ms allowed, and largest "
        "share.record.lock.duration.ms a share group may set for itself.",
        ge=30000, le=3600000)] = 60000
    group_share_delivery_count_limit: Annotated[int, _doc(
        "Deliveries of one record in a share group; released or timed out after the last, "
        "it is archived (never delivered again).", ge=2, le=10)] = 5
    group_share_partition_max_record_locks: Annotated[int, _doc(
        "Records in flight (between the share-partition start offset and the last offset "
        "acquired) per share partition; past it nothing new is delivered until the start "
        "moves.", ge=100, le=10000)] = 2000
    group_share_max_share_sessions: Annotated[int, _doc(
        "Share sessions (one per share consumer fetching) the broker keeps; a new one past "
        "it gets SHARE_SESSION_LIMIT_REACHED.", ge=1)] = 2000
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


_KEYS = {field.encode_name: field for field in msgspec.structs.fields(ServerProperties)}
_MSGSPEC_PATH = re.compile(r" - at `\$\.(.+?)`$")


def declared_keys() -> list[msgspec.structs.FieldInfo]:
    """Every declared key's field, in declaration order (`encode_name` is the key)."""
    return list(_KEYS.values())


def server_properties(raw: dict[str, str]) -> ServerProperties:
    """The declared keys of `raw` converted and bounds-checked, or ConfigError naming the
    first unknown key or bad value."""
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


def key_doc(key: str) -> str:
    """A declared key's doc string ("" for a key not declared)."""
    field = _KEYS.get(key)
    if field is None:
        return ""
    return next((meta.description for meta in key_metas(field.type) if meta.description), "")


def key_metas(annotation) -> list[Meta]:
    """The msgspec Meta (bounds, doc) of a declared field's annotation, optional ones too."""
    found = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Meta)]
    for arg in getattr(annotation, "__args__", ()):
        found.extend(key_metas(arg))
    return found
