"""Kafka 4.4's broker configs as its AlterConfigs and IncrementalAlterConfigs on a BROKER
resource see them: which keys may change at run time (DynamicBrokerConfig.ALL_DYNAMIC_CONFIGS,
with each key's type, default and bounds), which of those only per broker, the security keys
allowed only with a listener prefix, and the keys that cannot change at run time.

Kafka accepts every dynamic key, and keys it does not know at all (kept as custom configs for
plugins); it refuses the static ones (INVALID_REQUEST, "Cannot update these configs
dynamically").  This broker applies at run time only some of them (broker.parent.dynamic); the
others are stored as Kafka stores them and described with `no_effect`, why they do nothing
here.  Taken from the kafka_2.13 and kafka-server 4.4.0 jars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from broker.shared.config.values import InvalidValue, checked


def _gzip_level(name: str, value: str) -> None:
    level = int(checked(name, "int", value))
    if level != -1 and not 1 <= level <= 9:
        raise InvalidValue(name, value, "Value must be between 1 and 9 or equal to -1")


@dataclass(frozen=True)
class KafkaKey:
    name: str
    kind: str  # Kafka's ConfigDef type: int, short, long, double, boolean, string, list, class,
    # password
    default: str | None  # as DescribeConfigs shows it; None: no default
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()  # a string's values, or a list's items
    per_broker: bool = False  # Kafka refuses it at the cluster-default level (resource "")
    check: Callable[[str, str], None] | None = None  # a check of Kafka's own beyond the above

    def checked(self, value: str) -> str:
        """The value as stored, or InvalidValue in Kafka's words."""
        if self.check is not None:
            self.check(self.name, value)
        return checked(self.name, self.kind, value, self.minimum, self.maximum, self.choices)


_Key = KafkaKey
DYNAMIC: dict[str, KafkaKey] = {key.name: key for key in (
    _Key("background.threads", "int", "10", minimum=1),
    _Key("compression.gzip.level", "int", "-1", check=_gzip_level),
    _Key("compression.lz4.level", "int", "9", minimum=1, maximum=17),
    _Key("compression.type", "string", "producer",
         choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    _Key("compression.zstd.level", "int", "3", minimum=-131072, maximum=22),
    _Key("config.providers", "list", ""),
    _Key("cordoned.log.dirs", "list", "", per_broker=True),
    _Key("errors.deadletterqueue.auto.create.topics.enable", "boolean", "false"),
    _Key("errors.deadletterqueue.topic.name.prefix", "string", "dlq."),
    _Key("follower.fetch.last.tiered.offset.enable", "boolean", "false"),
    _Key("follower.replication.throttled.rate", "long", "9223372036854775807", minimum=0),
    _Key("group.consumer.assignment.interval.ms", "int", "1000", minimum=0),
    _Key("group.consumer.assignor.offload.enable", "boolean", "true"),
    _Key("group.coordinator.cached.buffer.max.bytes", "int", "1048588", minimum=524288),
    _Key("group.share.assignment.interval.ms", "int", "1000", minimum=0),
    _Key("group.share.assignor.offload.enable", "boolean", "true"),
    _Key("group.streams.assignment.interval.ms", "int", "1000", minimum=0),
    _Key("group.streams.assignor.offload.enable", "boolean", "true"),
    _Key("leader.replication.throttled.rate", "long", "9223372036854775807", minimum=0),
    _Key("listener.security.protocol.map", "string",
         "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
         per_broker=True),
    _Key("listeners", "list", "PLAINTEXT://:9092", per_broker=True),
    _Key("log.cleaner.backoff.ms", "long", "15000", minimum=0),
    _Key("log.cleaner.dedupe.buffer.size", "long", "134217728"),
    _Key("log.cleaner.delete.retention.ms", "long", "86400000", minimum=0),
    _Key("log.cleaner.io.buffer.load.factor", "double", "0.9"),
    _Key("log.cleaner.io.buffer.size", "int", "524288", minimum=0),
    _Key("log.cleaner.io.max.bytes.per.second", "double", "1.7976931348623157E308"),
    _Key("log.cleaner.max.compaction.lag.ms", "long", "9223372036854775807", minimum=1),
    _Key("log.cleaner.min.cleanable.ratio", "double", "0.5", minimum=0, maximum=1),
    _Key("log.cleaner.min.compaction.lag.ms", "long", "0", minimum=0),
    _Key("log.cleaner.threads", "int", "1", minimum=0),
    _Key("log.cleanup.policy", "list", "delete", choices=("compact", "delete")),
    _Key("log.flush.interval.messages", "long", "9223372036854775807", minimum=1),
    _Key("log.flush.interval.ms", "long", None),
    _Key("log.index.interval.bytes", "int", "4096", minimum=0),
    _Key("log.index.size.max.bytes", "int", "10485760", minimum=4),
    _Key("log.local.retention.bytes", "long", "-2", minimum=-2),
    _Key("log.local.retention.ms", "long", "-2", minimum=-2),
    _Key("log.message.timestamp.after.max.ms", "long", "3600000", minimum=0),
    _Key("log.message.timestamp.before.max.ms", "long", "9223372036854775807", minimum=0),
    _Key("log.message.timestamp.type", "string", "CreateTime",
         choices=("CreateTime", "LogAppendTime")),
    _Key("log.preallocate", "boolean", "false"),
    _Key("log.remote.copy.lag.bytes", "long", "-1", minimum=-1),
    _Key("log.remote.copy.lag.ms", "long", "0", minimum=-1),
    _Key("log.retention.bytes", "long", "-1"),
    _Key("log.retention.ms", "long", None),
    _Key("log.roll.jitter.ms", "long", None),
    _Key("log.roll.ms", "long", None),
    _Key("log.segment.bytes", "int", "1073741824", minimum=1048576),
    _Key("log.segment.delete.delay.ms", "long", "60000", minimum=0),
    _Key("max.connection.creation.rate", "int", "2147483647", minimum=0),
    _Key("max.connections", "int", "2147483647", minimum=0),
    _Key("max.connections.per.ip", "int", "2147483647", minimum=0),
    _Key("max.connections.per.ip.overrides", "string", ""),
    _Key("max.decompressed.message.bytes", "int", "2147483639", minimum=1, maximum=2147483639),
    _Key("message.max.bytes", "int", "1048588", minimum=0),
    _Key("metric.reporters", "list", "org.apache.kafka.common.metrics.JmxReporter"),
    _Key("min.insync.replicas", "int", "1", minimum=1),
    _Key("num.io.threads", "int", "8", minimum=1),
    _Key("num.network.threads", "int", "3", minimum=1),
    _Key("num.recovery.threads.per.data.dir", "int", "2", minimum=1),
    _Key("num.replica.fetchers", "int", "1", minimum=1),
    _Key("principal.builder.class", "class",
         "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
         per_broker=True),
    _Key("producer.id.expiration.ms", "int", "86400000", minimum=1),
    _Key("remote.fetch.max.wait.ms", "int", "500", minimum=1),
    _Key("remote.list.offsets.request.timeout.ms", "long", "30000", minimum=1),
    _Key("remote.log.index.file.cache.total.size.bytes", "long", "1073741824", minimum=1),
    _Key("remote.log.manager.copier.thread.pool.size", "int", "10", minimum=1),
    _Key("remote.log.manager.copy.max.bytes.per.second", "long", "9223372036854775807", minimum=1),
    _Key("remote.log.manager.expiration.thread.pool.size", "int", "10", minimum=1),
    _Key("remote.log.manager.fetch.max.bytes.per.second", "long", "9223372036854775807", minimum=1),
    _Key("remote.log.manager.follower.thread.pool.size", "int", "2", minimum=1),
    _Key("remote.log.reader.threads", "int", "10", minimum=1),
    _Key("replica.alter.log.dirs.io.max.bytes.per.second", "long", "9223372036854775807",
         minimum=0),
    _Key("sasl.enabled.mechanisms", "list", "GSSAPI", per_broker=True),
    _Key("sasl.jaas.config", "password", None, per_broker=True),
    _Key("sasl.kerberos.kinit.cmd", "string", "/usr/bin/kinit", per_broker=True),
    _Key("sasl.kerberos.min.time.before.relogin", "long", "60000", per_broker=True),
    _Key("sasl.kerberos.principal.to.local.rules", "list", "DEFAULT", per_broker=True),
    _Key("sasl.kerberos.service.name", "string", None, per_broker=True),
    _Key("sasl.kerberos.ticket.renew.jitter", "double", "0.05", per_broker=True),
    _Key("sasl.kerberos.ticket.renew.window.factor", "double", "0.8", per_broker=True),
    _Key("sasl.login.refresh.buffer.seconds", "short", "300", per_broker=True),
    _Key("sasl.login.refresh.min.period.seconds", "short", "60", per_broker=True),
    _Key("sasl.login.refresh.window.factor", "double", "0.8", per_broker=True),
    _Key("sasl.login.refresh.window.jitter", "double", "0.05", per_broker=True),
    _Key("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI", per_broker=True),
    _Key("share.coordinator.cached.buffer.max.bytes", "int", "1048588", minimum=524288),
    _Key("ssl.cipher.suites", "list", "", per_broker=True),
    _Key("ssl.client.auth", "string", "none",
         choices=("required", "requested", "none"), per_broker=True),
    _Key("ssl.enabled.protocols", "list", "TLSv1.2,TLSv1.3", per_broker=True),
    _Key("ssl.endpoint.identification.algorithm", "string", "https", per_broker=True),
    _Key("ssl.engine.factory.class", "class", None, per_broker=True),
    _Key("ssl.key.password", "password", None, per_broker=True),
    _Key("ssl.keymanager.algorithm", "string", "SunX509", per_broker=True),
    _Key("ssl.keystore.certificate.chain", "password", None, per_broker=True),
    _Key("ssl.keystore.key", "password", None, per_broker=True),
    _Key("ssl.keystore.location", "string", None, per_broker=True),
    _Key("ssl.keystore.password", "password", None, per_broker=True),
    _Key("ssl.keystore.type", "string", "JKS", per_broker=True),
    _Key("ssl.protocol", "string", "TLSv1.3", per_broker=True),
    _Key("ssl.provider", "string", None, per_broker=True),
    _Key("ssl.secure.random.implementation", "string", None, per_broker=True),
    _Key("ssl.trustmanager.algorithm", "string", "PKIX", per_broker=True),
    _Key("ssl.truststore.certificates", "password", None, per_broker=True),
    _Key("ssl.truststore.location", "string", None, per_broker=True),
    _Key("ssl.truststore.password", "password", None, per_broker=True),
    _Key("ssl.truststore.type", "string", "JKS", per_broker=True),
    _Key("transaction.partition.verification.enable", "boolean", "true"),
    _Key("unclean.leader.election.enable", "boolean", "false"),
)}

# SslConfigs.RECONFIGURABLE_CONFIGS: only as listener.name.<listener>.<key>.
PER_LISTENER_ONLY = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.keystore.key", "ssl.keystore.certificate.chain", "ssl.truststore.type",
    "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.certificates"})
# Listener keys Kafka takes at the cluster-default level too (the others are per broker).
CLUSTER_LEVEL_LISTENER_KEYS = frozenset({"max.connections", "max.connection.creation.rate",
                                         "num.network.threads"})
PASSWORDS = frozenset(key.name for key in DYNAMIC.values() if key.kind == "password")

# DynamicConfig.Broker.nonDynamicProps: Kafka's broker keys that cannot change at run time.
STATIC = frozenset("""
add.partitions.to.txn.retry.backoff.max.ms add.partitions.to.txn.retry.backoff.ms
advertised.listeners alter.config.policy.class.name
alter.log.dirs.replication.quota.window.num
alter.log.dirs.replication.quota.window.size.seconds authorizer.class.name
auto.create.topics.enable auto.leader.rebalance.enable broker.heartbeat.interval.ms
broker.id broker.rack broker.session.timeout.ms client.quota.callback.class
connection.failed.authentication.delay.ms connections.max.idle.ms connections.max.reauth.ms
controlled.shutdown.enable controller.listener.names
controller.performance.always.log.threshold.ms controller.performance.sample.period.ms
controller.quorum.append.linger.ms controller.quorum.auto.join.enable
controller.quorum.bootstrap.servers controller.quorum.election.backoff.max.ms
controller.quorum.election.timeout.ms controller.quorum.fetch.max.bytes
controller.quorum.fetch.snapshot.max.bytes controller.quorum.fetch.timeout.ms
controller.quorum.request.timeout.ms controller.quorum.retry.backoff.ms
controller.quorum.voters controller.quota.window.num controller.quota.window.size.seconds
controller.socket.timeout.ms create.topic.policy.class.name default.replication.factor
delegation.token.expiry.check.interval.ms delegation.token.expiry.time.ms
delegation.token.max.lifetime.ms delegation.token.secret.key
delete.records.purgatory.purge.interval.requests delete.topic.enable early.start.listeners
fetch.max.bytes fetch.purgatory.purge.interval.requests group.consumer.assignors
group.consumer.heartbeat.interval.ms group.consumer.max.assignment.interval.ms
group.consumer.max.heartbeat.interval.ms group.consumer.max.session.timeout.ms
group.consumer.max.size group.consumer.migration.policy
group.consumer.min.assignment.interval.ms group.consumer.min.heartbeat.interval.ms
group.consumer.min.session.timeout.ms group.consumer.regex.refresh.interval.ms
group.consumer.session.timeout.ms group.coordinator.append.linger.ms
group.coordinator.background.threads group.coordinator.rebalance.protocols
group.coordinator.threads group.initial.rebalance.delay.ms group.max.session.timeout.ms
group.max.size group.min.session.timeout.ms group.share.assignors
group.share.delivery.count.limit group.share.dlq.manager.class.name
group.share.heartbeat.interval.ms group.share.initialize.retry.interval.ms
group.share.max.assignment.interval.ms group.share.max.delivery.count.limit
group.share.max.heartbeat.interval.ms group.share.max.partition.max.record.locks
group.share.max.record.lock.duration.ms group.share.max.session.timeout.ms
group.share.max.share.sessions group.share.max.size group.share.min.assignment.interval.ms
group.share.min.delivery.count.limit group.share.min.heartbeat.interval.ms
group.share.min.partition.max.record.locks group.share.min.record.lock.duration.ms
group.share.min.session.timeout.ms group.share.partition.max.record.locks
group.share.persister.class.name group.share.record.lock.duration.ms
group.share.session.timeout.ms group.streams.acceptable.recovery.lag group.streams.assignors
group.streams.heartbeat.interval.ms group.streams.initial.rebalance.delay.ms
group.streams.max.assignment.interval.ms group.streams.max.heartbeat.interval.ms
group.streams.max.session.timeout.ms group.streams.max.size
group.streams.max.standby.replicas group.streams.max.warmup.replicas
group.streams.min.assignment.interval.ms group.streams.min.heartbeat.interval.ms
group.streams.min.session.timeout.ms group.streams.min.task.offset.interval.ms
group.streams.num.standby.replicas group.streams.num.warmup.replicas
group.streams.rack.aware.assignment.tags group.streams.session.timeout.ms
group.streams.task.offset.interval.ms group.streams.topology.description.plugin.class
initial.broker.registration.timeout.ms inter.broker.listener.name
internal.metadata.delete.delay.millis internal.metadata.log.segment.bytes
internal.metadata.max.batch.size.in.bytes kafka.metrics.polling.interval.secs
kafka.metrics.reporters leader.imbalance.check.interval.seconds log.cleaner.enable log.dir
log.dir.failure.timeout.ms log.dirs log.flush.offset.checkpoint.interval.ms
log.flush.scheduler.interval.ms log.flush.start.offset.checkpoint.interval.ms
log.initial.task.delay.ms log.retention.check.interval.ms log.retention.hours
log.retention.minutes log.roll.hours log.roll.jitter.hours
max.incremental.fetch.session.cache.slots max.request.partition.size.limit metadata.log.dir
metadata.log.max.record.bytes.between.snapshots metadata.log.max.snapshot.interval.ms
metadata.log.segment.bytes metadata.log.segment.ms metadata.max.idle.interval.ms
metadata.max.retention.bytes metadata.max.retention.ms metrics.num.samples
metrics.recording.level metrics.sample.window.ms node.id num.partitions
num.replica.alter.log.dirs.threads offset.metadata.max.bytes offsets.commit.timeout.ms
offsets.load.buffer.size offsets.retention.check.interval.ms offsets.retention.minutes
offsets.topic.compression.codec offsets.topic.num.partitions
offsets.topic.replication.factor offsets.topic.segment.bytes process.roles
producer.id.expiration.check.interval.ms producer.purgatory.purge.interval.requests
queued.max.request.bytes queued.max.requests quota.window.num quota.window.size.seconds
remote.log.index.file.cache.ttl.ms remote.log.manager.copy.quota.window.num
remote.log.manager.copy.quota.window.size.seconds remote.log.manager.fetch.quota.window.num
remote.log.manager.fetch.quota.window.size.seconds remote.log.manager.task.interval.ms
remote.log.manager.task.retry.backoff.max.ms remote.log.manager.task.retry.backoff.ms
remote.log.manager.task.retry.jitter remote.log.manager.thread.pool.size
remote.log.metadata.custom.metadata.max.bytes remote.log.metadata.manager.class.name
remote.log.metadata.manager.class.path remote.log.metadata.manager.impl.prefix
remote.log.metadata.manager.listener.name remote.log.reader.max.pending.tasks
remote.log.storage.manager.class.name remote.log.storage.manager.class.path
remote.log.storage.manager.impl.prefix remote.log.storage.system.enable
replica.fetch.backoff.ms replica.fetch.max.bytes replica.fetch.min.bytes
replica.fetch.response.max.bytes replica.fetch.wait.max.ms
replica.high.watermark.checkpoint.interval.ms replica.lag.time.max.ms replica.selector.class
replica.socket.receive.buffer.bytes replica.socket.timeout.ms replication.quota.window.num
replication.quota.window.size.seconds request.timeout.ms sasl.client.callback.handler.class
sasl.login.callback.handler.class sasl.login.class sasl.login.connect.timeout.ms
sasl.login.read.timeout.ms sasl.login.retry.backoff.max.ms sasl.login.retry.backoff.ms
sasl.mechanism.controller.protocol sasl.oauthbearer.allow.unverified.audience
sasl.oauthbearer.allow.unverified.issuer sasl.oauthbearer.assertion.algorithm
sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub
sasl.oauthbearer.assertion.file sasl.oauthbearer.assertion.private.key.file
sasl.oauthbearer.assertion.private.key.passphrase sasl.oauthbearer.assertion.template.file
sasl.oauthbearer.client.credentials.client.id
sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.clock.skew.seconds
sasl.oauthbearer.expected.audience sasl.oauthbearer.expected.issuer
sasl.oauthbearer.jwks.endpoint.refresh.ms
sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms
sasl.oauthbearer.jwks.endpoint.retry.backoff.ms sasl.oauthbearer.jwks.endpoint.url
sasl.oauthbearer.jwt.retriever.class sasl.oauthbearer.jwt.validator.class
sasl.oauthbearer.scope sasl.oauthbearer.scope.claim.name sasl.oauthbearer.sub.claim.name
sasl.oauthbearer.token.endpoint.url sasl.server.callback.handler.class
sasl.server.max.receive.size security.inter.broker.protocol security.providers
server.max.startup.time.ms share.coordinator.append.linger.ms
share.coordinator.cold.partition.snapshot.interval.ms share.coordinator.load.buffer.size
share.coordinator.snapshot.update.records.per.snapshot
share.coordinator.state.topic.compression.codec share.coordinator.state.topic.min.isr
share.coordinator.state.topic.num.partitions share.coordinator.state.topic.prune.interval.ms
share.coordinator.state.topic.replication.factor share.coordinator.state.topic.segment.bytes
share.coordinator.threads share.coordinator.write.timeout.ms
share.fetch.purgatory.purge.interval.requests socket.connection.setup.timeout.max.ms
socket.connection.setup.timeout.ms socket.listen.backlog.size socket.receive.buffer.bytes
socket.request.max.bytes socket.send.buffer.bytes ssl.allow.dn.changes ssl.allow.san.changes
ssl.principal.mapping.rules telemetry.max.bytes
transaction.abort.timed.out.transaction.cleanup.interval.ms transaction.max.timeout.ms
transaction.remove.expired.transaction.cleanup.interval.ms
transaction.state.log.load.buffer.size transaction.state.log.min.isr
transaction.state.log.num.partitions transaction.state.log.replication.factor
transaction.state.log.segment.bytes transaction.two.phase.commit.enable
transactional.id.expiration.ms unclean.leader.election.interval.ms
unstable.api.versions.enable unstable.feature.versions.enable

""".split())

_NO_SUCH_FEATURE = (
    (("remote.", "log.local.retention.", "log.remote.", "follower.fetch.last.tiered."),
     "tiered storage is not offered here"),
    (("sasl.kerberos.", "sasl.login.", "sasl.mechanism.inter.broker.protocol"),
     "Kerberos, OAUTHBEARER logins and inter-broker SASL are not offered here"),
    (("leader.replication.", "follower.replication.", "num.replica.fetchers",
      "replica.alter.log.dirs.", "unclean.leader.election."),
     "a single broker replicates nothing"),
    (("group.share.", "share.", "errors.deadletterqueue."), "share groups are not offered here"),
    (("group.consumer.", "group.streams.", "group.coordinator."),
     "the group coordinator is the classic protocol's, in the parent"),
    (("num.io.threads", "background.threads", "num.recovery.threads.per.data.dir"),
     "requests are served by the worker processes (num.network.threads, read at start-up)"),
)


def base_name(key: str) -> str:
    """A key without its listener.name.<listener>. prefix."""
    return key.split(".", 3)[3] if key.startswith("listener.name.") and key.count(".") >= 3 \
        else key


def no_effect(key: str, declared: bool) -> str:
    """Why a stored dynamic key does nothing here; `declared`: the broker has a key of that
    name (read from its configuration at start-up)."""
    if declared:
        return "this broker reads it from its configuration at start-up only"
    base = base_name(key)
    for prefixes, why in _NO_SUCH_FEATURE:
        if base.startswith(prefixes):
            return why
    return "this broker has no such setting"


def password(key: str) -> bool:
    """A password, also per listener or per mechanism (Kafka's isPasswordConfig)."""
    return any(key.endswith(name) for name in PASSWORDS)
