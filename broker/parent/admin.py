"""The parent's answers to the configuration, quota, SCRAM and ACL requests workers forward
(broker.parent.forwarded routes them here).

`AdminService` answers config, quota, SCRAM and ACL requests (the last through
broker.parent.acl_store), each authorized first as Kafka does (broker.shared.access): configs need
DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster (BROKER resources), on the topic or on the group
(GROUP resources), quotas the same on the cluster, SCRAM credentials DESCRIBE / ALTER on the
cluster.

DescribeConfigs and IncrementalAlterConfigs (and AlterConfigs) on the BROKER resource (this
node's id, or "" for the cluster default), on TOPIC resources and on GROUP resources (a group's
own configs, broker.parent.group_configs, written to their own file), DescribeClientQuotas and
AlterClientQuotas for the `ip` entity's connection_creation_rate and the user/client-id
entities' byte rates and request percentage.
A change is validated whole, persisted (broker.parent.dynamic), applied through `on_change`,
and only then acknowledged.  With a control plane (KIP-291) changes are served only on its
listener (`may_alter`); on data listeners every resource or entry gets
CLUSTER_AUTHORIZATION_FAILED (broker.shared.protocol.refusal).

No answer grows with how often a request names something: DescribeConfigs describes each
resource and each known key once, DescribeUserScramCredentials each user once (Kafka's
DUPLICATE_RESOURCE for one named twice), and Kafka's own checks refuse the rest before any
work (a resource or a key named twice in an alteration, a quota filter naming an entity type
twice).  DescribeConfigs, DescribeAcls and DeleteAcls charge what they answer to a
ResponseBudget (broker.parent.forwarded) as they go.
"""

from __future__ import annotations

import collections
import functools
import logging

from broker.parent import kafka_broker_keys
from broker.parent.acl_store import AclService, AclStore
from broker.parent.dynamic import (DEFAULT_ENTITY, IP_RATE_KEY, ConfigProblem, DynamicConfig,
                                   alter_client_quota, ip_entity_key)
from broker.parent.forwarded import budget_of, decode_forwarded
from broker.parent.group_configs import GroupConfigError, GroupConfigs
from broker.parent.scram import ScramStore
from broker.shared.access import Access
from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.apis import BY_NAME
from broker.shared.client_quotas import DEFAULT, ENTITY_TYPES, entity_key
from broker.shared.config import declared_keys
from broker.shared.events import ConfigChanged, EventLog
from broker.shared.log import topic_config
from broker.shared.protocol.context import NO_THROTTLE, RequestContext, error_code
from broker.shared.protocol.errors import ErrorCode
from broker.shared.protocol.refusal import (refused_alter_configs, refused_alter_quotas,
                                            refused_alter_scram)
from broker.shared.sasl import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_TYPES, scram_credential

log = logging.getLogger("broker.parent.admin")
SCRAM_IDS = {name: number for number, name in SCRAM_TYPES.items()}
HIDDEN = "[hidden]"  # what the logs show of a secret's value (Kafka's word)

BROKER_RESOURCE = 4
TOPIC_RESOURCE = 2
GROUP_RESOURCE = 32
# Kafka's AclApis: SCRAM credentials need DESCRIBE / ALTER on the cluster.
SCRAM_DESCRIBE, SCRAM_ALTER = Operation.DESCRIBE, Operation.ALTER
QUOTA_ENTITY_TYPES = ("ip", *ENTITY_TYPES)  # what DescribeClientQuotas filters may name
MATCH_EXACT = 0
MATCH_TYPES = {MATCH_EXACT: "MATCH_TYPE_EXACT", 1: "MATCH_TYPE_DEFAULT", 2: "MATCH_TYPE_SPECIFIED"}


# SCRAM users per mechanism: every worker holds them all and is sent them after each change.
MAX_SCRAM_USERS = 10_000
# Quota entities stored (ip, user, client-id and their defaults): each is kept in the parent,
# persisted and sent to every worker after a change, so their number is bounded.
MAX_QUOTA_ENTITIES = 10_000


class AdminService:
    def __init__(self, node_id: int, dynamic: DynamicConfig, on_change, may_alter=None,
                 events: EventLog | None = None, scram: ScramStore | None = None,
                 access: Access | None = None, acls: AclService | None = None,
                 group_configs: GroupConfigs | None = None):
        self.node_id = node_id
        self.access = access or Access(False)  # who may do what (broker.shared.access)
        if acls is None and dynamic is not None:
            store = AclStore(dynamic.config.log_dirs[0])
            store.load()
            acls = AclService(store, self.access)
        self.acls = acls
        if scram is None and dynamic is not None:
            scram = ScramStore(dynamic.config.log_dirs[0])
            scram.load()
        self.scram = scram  # SCRAM credentials (broker.parent.scram)
        if group_configs is None and dynamic is not None:
            group_configs = GroupConfigs(dynamic.config.props, dynamic.config.log_dirs[0])
        self.group_configs = group_configs  # the groups' own configs, durable
        self.dynamic = dynamic
        self.on_change = on_change  # called after a change was persisted
        self.may_alter = may_alter or (lambda _listener: True)
        self.events = events
        self._handlers = {BY_NAME[name].key: handler for name, handler in (
            ("DescribeConfigs", self._describe_configs),
            ("IncrementalAlterConfigs", self._alter_configs),
            ("DescribeClientQuotas", self._describe_quotas),
            ("AlterClientQuotas", self._alter_quotas),
            ("DescribeUserScramCredentials", self._describe_scram),
            ("AlterUserScramCredentials", self._alter_scram),
            ("DescribeAcls", functools.partial(self._with_budget, acls.describe)),
            ("CreateAcls", acls.create),
            ("DeleteAcls", functools.partial(self._with_budget, acls.delete)),
            ("AlterConfigs", functools.partial(self._alter_configs, replace=True)))}
        self.topics = None  # the parent's TopicRegistry, once the log is recovered

    def _with_budget(self, handler, ctx: RequestContext, body, who: str) -> bytes:
        return handler(ctx, body, who, budget_of(self.dynamic.config.props))

    def _record(self, listener: int, who: str, kind: str, changes: dict) -> None:
        if self.events is not None:
            self.events.emit(ConfigChanged(
                listener=self.dynamic.config.listeners[listener].name, peer=who, kind=kind,
                changes={key: None if value is None else str(value)
                         for key, value in changes.items()}))

    def handle(self, request: bytes, listener: int, who: str, user: str = "ANONYMOUS") -> bytes:
        """Answer one forwarded request; `who` is the client's "ip:port", `user` its
        principal's name."""
        ctx, body = decode_forwarded(request, listener, who, user)
        return self._handlers[ctx.api_key](ctx, body, who)

    def _denied(self, ctx: RequestContext, operation: Operation, resource_type: int,
                name: str) -> tuple[str, str] | None:
        """A config resource the principal may not describe or alter: Kafka's refusal."""
        if resource_type == TOPIC_RESOURCE:
            if not self.access.check(ctx, operation, ResourceType.TOPIC, name):
                return "topic_authorization_failed", f"{operation.name} on topic {name} denied"
        elif resource_type == GROUP_RESOURCE:
            if not self.access.check(ctx, operation, ResourceType.GROUP, name):
                return "group_authorization_failed", f"{operation.name} on group {name} denied"
        elif not self.access.check(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
            return "cluster_authorization_failed", f"{operation.name} on the cluster denied"
        return None

    # --- configs --------------------------------------------------------------------------

    def _resource_problem(self, resource_type: int, name: str,
                          altering: bool = False) -> tuple[str, str] | None:
        if resource_type == TOPIC_RESOURCE:
            if self.topics is None or self.topics.get(name) is None:
                return "unknown_topic_or_partition", f"The topic '{name}' does not exist."
            return None
        if resource_type == GROUP_RESOURCE:  # any group, existing or not, as Kafka
            if name:
                return None
            return "invalid_request", ("Default group resources are not allowed." if altering
                                       else "Group name must not be empty")
        if resource_type != BROKER_RESOURCE:
            return "invalid_request", f"resource type {resource_type} is not supported yet"
        if name not in ("", str(self.node_id)):
            return "invalid_request", f"unexpected broker id {name}; this is broker {self.node_id}"
        return None

    def _describe_configs(self, ctx: RequestContext, body, _who: str) -> bytes:
        """Each resource once, each of its keys once (a key Kafka does not know is left
        out, as Kafka does); every entry charged to the answer's budget before the next
        resource is described."""
        budget = budget_of(self.dynamic.config.props)
        documentation = getattr(body, "include_documentation", False)
        synonyms = getattr(body, "include_synonyms", False)
        results = []
        for (resource_type, name), keys in _config_resources(body.resources).items():
            budget.charge(len(name))
            problem = self._denied(ctx, Operation.DESCRIBE_CONFIGS, resource_type, name) or \
                self._resource_problem(resource_type, name)
            entry = {"resource_type": resource_type, "resource_name": name, "configs": []}
            if problem is not None:
                budget.charge(len(problem[1]), 0)
                results.append(dict(entry, error_code=error_code(problem[0]),
                                    error_message=problem[1]))
                continue
            if resource_type == TOPIC_RESOURCE:
                entry["configs"] = topic_config.describe(
                    self.dynamic.config.props, self.topics.configs(name), keys, synonyms,
                    documentation)
            elif resource_type == GROUP_RESOURCE:
                entry["configs"] = self.group_configs.describe(name, keys, synonyms,
                                                               documentation)
            else:
                known = self._describable(name == "")
                if keys is not None:
                    declared = set(known)
                    known = [key for key in keys if key in declared]
                described = (self.dynamic.describe(key, name == "", synonyms, documentation)
                             for key in known)
                entry["configs"] = [config for config in described if config is not None]
            budget.charge(sum(map(_config_bytes, entry["configs"])), len(entry["configs"]))
            results.append(dict(entry, error_code=ErrorCode.none, error_message=None))
        return ctx.respond({"throttle_time": NO_THROTTLE, "results": results})

    def _describable(self, cluster_default: bool) -> list[str]:
        """The broker resource's keys: every declared one, each listener's connection
        limits, Kafka's dynamic keys, and whatever else a dynamic layer holds (a listener's
        key store, a custom key); of the cluster default, only what its layer holds."""
        stored = self.dynamic.stored
        if cluster_default:
            return list(stored.cluster_default)
        keys = [field.encode_name for field in declared_keys()]
        for listener in self.dynamic.config.listeners:
            for suffix in ("max.connections", "max.connection.creation.rate"):
                keys.append(self.dynamic.listener_key(listener.name, suffix))
        return list(dict.fromkeys([*keys, *kafka_broker_keys.DYNAMIC, *stored.broker,
                                   *stored.cluster_default]))

    def _alter_configs(self, ctx: RequestContext, body, who: str,
                       replace: bool = False) -> bytes:
        """IncrementalAlterConfigs: each operation; with `replace`, AlterConfigs (the legacy
        API some admin clients still use): each resource's dynamic configs become exactly the
        ones given."""
        if not self.may_alter(ctx.listener_index):
            return refused_alter_configs(ctx, body)
        results, changed = [], False
        named = collections.Counter((r.resource_type, r.resource_name) for r in body.resources)
        for resource in body.resources:
            entry = {"resource_type": resource.resource_type,
                     "resource_name": resource.resource_name}
            problem = _duplicated(resource, named) or \
                self._denied(ctx, Operation.ALTER_CONFIGS, resource.resource_type,
                             resource.resource_name) or \
                self._resource_problem(resource.resource_type, resource.resource_name, True)
            if problem is None:
                alter = {TOPIC_RESOURCE: self._alter_topic, GROUP_RESOURCE: self._alter_group}\
                    .get(resource.resource_type, self._alter_resource)
                problem = alter(resource, body.validate_only, who, replace)
                # Workers hold the dynamic configs, not the groups' (read in the parent).
                changed |= problem is None and not body.validate_only and \
                    resource.resource_type != GROUP_RESOURCE
                if problem is None and not body.validate_only:
                    self._record(ctx.listener_index, who, "config",
                                 self._shown(resource.resource_type, resource.configs))
            code, message = problem if problem is not None else (None, None)
            results.append(dict(entry, error_code=error_code(code), error_message=message))
        if changed:
            self.on_change()
        return ctx.respond({"throttle_time": NO_THROTTLE, "responses": results})

    def _alter_topic(self, resource, validate_only: bool, who: str,
                     replace: bool = False) -> tuple[str, str] | None:
        """A topic's own configs: each operation (IncrementalAlterConfigs), or the whole set
        (`replace`, AlterConfigs); written by the registry under the topics lock."""
        name = resource.resource_name
        own = {} if replace else self.topics.configs(name)
        try:
            for item in resource.configs:
                own = topic_config.altered(own, item.name, getattr(item, "config_operation", 0),
                                           item.value)
        except topic_config.TopicConfigError as error:
            return "invalid_config", str(error)
        if validate_only:
            return None
        problem = self.topics.set_configs(name, own)
        if problem is not None:
            return problem, f"The topic '{name}' does not exist."
        log.info("topic %s configs changed by %s: %s", name, who or "a client", own)
        topic_config.note_inert(log, name, [item.name for item in resource.configs
                                            if item.name in own])
        return None

    def _alter_group(self, resource, validate_only: bool, who: str,
                     replace: bool = False) -> tuple[str, str] | None:
        """A group's own configs: each operation (IncrementalAlterConfigs), or the whole set
        (`replace`, AlterConfigs), checked whole as Kafka's GroupConfig; written to the
        group configs' file before the answer."""
        name = resource.resource_name
        configs = self.group_configs
        try:
            own = configs.validated(name, {} if replace else configs.own(name), (
                (item.name, getattr(item, "config_operation", 0), item.value)
                for item in resource.configs))
        except GroupConfigError as error:
            return error.code, str(error)
        if validate_only:
            return None
        try:
            configs.replace(name, own)
        except OSError as error:
            log.error("group %s configs not written: %s", name, error)
            return "kafka_storage_error", f"The group configs could not be written: {error}"
        log.info("group %s configs changed by %s: %s", name, who or "a client", own)
        return None

    def _alter_resource(self, resource, validate_only: bool, who: str,
                        replace: bool = False) -> tuple[str, str] | None:
        """The broker's dynamic layer: each operation, or the whole set (`replace`)."""
        stored = self.dynamic.stored
        cluster_default = resource.resource_name == ""
        layer_name = "cluster_default" if cluster_default else "broker"
        layer = {} if replace else dict(getattr(stored, layer_name))
        try:
            for item in resource.configs:
                self.dynamic.alter(layer, item.name, getattr(item, "config_operation", 0),
                                   item.value, cluster_default)
            self.dynamic.check_room(layer)
            if any(".ssl." in item.name for item in resource.configs):  # a key store change
                layers = {"broker": stored.broker, "cluster_default": stored.cluster_default,
                          layer_name: layer}
                self.dynamic.check_tls(layers["broker"], layers["cluster_default"])
        except ConfigProblem as problem:
            return problem.code, str(problem)
        if validate_only:
            return None
        setattr(stored, layer_name, layer)
        self.dynamic.save()
        log.info("dynamic config %s changed by %s: %s", layer_name, who or "a client",
                 self._shown(BROKER_RESOURCE, resource.configs))
        self._note_no_effect(layer_name, [item.name for item in resource.configs
                                          if item.name in layer])
        return None

    def _note_no_effect(self, layer_name: str, keys: list[str]) -> None:
        """One log line naming the keys just set that are stored without effect, and why."""
        reasons = {key: spec.no_effect for key in keys
                   if not (spec := self.dynamic.check_key(key)).applied}
        if reasons:
            log.info("dynamic config %s: %s stored as Kafka stores it, but without effect here "
                     "(%s)", layer_name, ", ".join(reasons),
                     "; ".join(f"{key}: {why}" for key, why in reasons.items()))

    def _shown(self, resource_type: int, configs) -> dict[str, str | None]:
        """An alteration's keys and values as the log and the event log may show them (Kafka's
        [hidden] for a secret)."""
        secret = self.dynamic.sensitive if resource_type == BROKER_RESOURCE else \
            (lambda _key: False)
        return {item.name: HIDDEN if item.value is not None and secret(item.name)
                else item.value for item in configs}

    # --- SCRAM credentials ----------------------------------------------------------------

    def _describe_scram(self, ctx: RequestContext, body, _who: str) -> bytes:
        denied = self._denied(ctx, SCRAM_DESCRIBE, BROKER_RESOURCE, CLUSTER_NAME)
        if denied is not None:
            return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": error_code(denied[0]),
                                "error_message": denied[1], "results": []})
        # Each user once, as Kafka's ScramImage.describe: one named twice gets one entry,
        # DUPLICATE_RESOURCE.
        named = collections.Counter(user.name for user in body.users) if body.users else \
            dict.fromkeys(sorted({user for users in self.scram.users.values() for user in users}),
                          1)
        results = []
        for name, count in named.items():
            infos = [{"mechanism": SCRAM_IDS[mechanism], "iterations": iterations}
                     for mechanism, iterations in self.scram.mechanisms_of(name)]
            code, message = None, None
            if count > 1:
                code, message = ("duplicate_resource", "Cannot describe SCRAM credentials for "
                                                       f"the same user twice in a single request: "
                                                       f"{name}")
            elif not infos:
                code, message = ("resource_not_found", "Attempt to describe a user credential "
                                                       f"that does not exist: {name}")
            results.append({"user": name, "error_code": error_code(code), "error_message": message,
                            "credential_infos": [] if code else infos})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                            "error_message": None, "results": results})

    def _alter_scram(self, ctx: RequestContext, body, who: str) -> bytes:
        if not self.may_alter(ctx.listener_index):
            return refused_alter_scram(ctx, body)
        denied = self._denied(ctx, SCRAM_ALTER, BROKER_RESOURCE, CLUSTER_NAME)
        if denied is not None:
            return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
                {"user": name, "error_code": error_code(denied[0]), "error_message": denied[1]}
                for name in dict.fromkeys(item.name for item in (*body.deletions,
                                                                 *body.upsertions))]})
        users = {mechanism: dict(entries) for mechanism, entries in self.scram.users.items()}
        named = collections.Counter(item.name for item in (*body.deletions, *body.upsertions))
        results, changed = {}, False
        for item in (*body.deletions, *body.upsertions):  # each user independently
            problem = self._scram_problem(item, users, named)
            if problem is None:
                self._apply_scram(item, users)
                changed = True
            results[item.name] = problem or (None, None)
        if changed:
            self.scram.save({m: entries for m, entries in users.items() if entries})
            log.info("SCRAM credentials changed by %s: %s", who or "a client",
                     sorted(name for name, (code, _) in results.items() if code is None))
            self.on_change()
        return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
            {"user": name, "error_code": error_code(code), "error_message": message}
            for name, (code, message) in results.items()]})

    @staticmethod
    def _scram_problem(item, users, named) -> tuple[str, str] | None:
        if not item.name:
            return "unacceptable_credential", "Username must not be empty"
        if named[item.name] > 1:
            return "duplicate_resource", ("A user credential cannot be altered twice in the "
                                          "same request")  # Kafka's words
        mechanism = SCRAM_TYPES.get(item.mechanism)
        if mechanism is None:
            return "unsupported_sasl_mechanism", f"unknown SCRAM mechanism {item.mechanism}"
        if not hasattr(item, "salted_password"):  # a deletion
            if item.name not in users.get(mechanism, {}):
                return ("resource_not_found", "Attempt to delete a user credential that does "
                                              "not exist")
            return None
        if item.iterations < MIN_ITERATIONS:
            return "unacceptable_credential", f"Too few iterations: {item.iterations}"
        if item.iterations > MAX_ITERATIONS:
            return "unacceptable_credential", f"Too many iterations: {item.iterations}"
        if not item.salt or not item.salted_password:
            return "unacceptable_credential", "salt and salted password are required"
        mechanism_users = users.get(mechanism, {})
        if item.name not in mechanism_users and len(mechanism_users) >= MAX_SCRAM_USERS:
            return "unacceptable_credential", (f"{MAX_SCRAM_USERS} {mechanism} users are stored "
                                               "already (the most kept)")
        return None

    @staticmethod
    def _apply_scram(item, users) -> None:
        mechanism = SCRAM_TYPES[item.mechanism]
        entries = users.setdefault(mechanism, {})
        if not hasattr(item, "salted_password"):
            entries.pop(item.name, None)
            return
        entries[item.name] = scram_credential(mechanism, bytes(item.salt),
                                              bytes(item.salted_password), item.iterations)

    # --- quotas ---------------------------------------------------------------------------

    def _describe_quotas(self, ctx: RequestContext, body, _who: str) -> bytes:
        denied = self._denied(ctx, Operation.DESCRIBE_CONFIGS, BROKER_RESOURCE, CLUSTER_NAME) \
            or _filter_problem(body.components)
        if denied is not None:
            return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": error_code(denied[0]),
                                "error_message": denied[1], "entries": []})
        entries = []
        for entity, values in self._all_quotas():
            if self._matches(body.components, body.strict, entity):
                entries.append({"entity": [{"entity_type": kind, "entity_name": name}
                                           for kind, name in entity.items()],
                                "values": [{"key": key, "value": value}
                                           for key, value in sorted(values.items())]})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                            "error_message": None, "entries": entries})

    def _all_quotas(self):
        """(entity as {type: name or None for the default}, {key: value}) of every quota."""
        stored = self.dynamic.stored
        for name, rate in sorted(stored.ip_quotas.items()):
            yield {"ip": None if name == DEFAULT_ENTITY else name}, {IP_RATE_KEY: rate}
        for key, values in sorted(stored.client_quotas.items()):
            entity = {}
            for part in key.split(","):
                kind, _, name = part.partition("=")
                entity[kind] = None if name == DEFAULT else name
            yield entity, values

    @staticmethod
    def _matches(components, strict: bool, entity: dict) -> bool:
        for component in components:
            if component.entity_type not in entity:
                return False
            name = entity[component.entity_type]
            if component.match_type == 0 and name != component.match:
                return False
            if component.match_type == 1 and name is not None:
                return False
        if strict:
            return {c.entity_type for c in components} == set(entity)
        return True

    def _alter_quotas(self, ctx: RequestContext, body, who: str) -> bytes:
        if not self.may_alter(ctx.listener_index):
            return refused_alter_quotas(ctx, body)
        denied = self._denied(ctx, Operation.ALTER_CONFIGS, BROKER_RESOURCE, CLUSTER_NAME)
        if denied is not None:
            return ctx.respond({"throttle_time": NO_THROTTLE, "entries": [
                {"error_code": error_code(denied[0]), "error_message": denied[1],
                 "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name}
                            for e in entry.entity]} for entry in body.entries]})
        results, changed = [], False
        ip_quotas = dict(self.dynamic.stored.ip_quotas)
        client_quotas = dict(self.dynamic.stored.client_quotas)
        for entry in body.entries:
            entity = [{"entity_type": e.entity_type, "entity_name": e.entity_name}
                      for e in entry.entity]
            kinds = [e.entity_type for e in entry.entity]
            problem = None
            try:
                # An entry applies whole or not at all: its ops run on a copy of its entity's
                # values only (a copy of every entity per entry made big requests quadratic).
                if kinds == ["ip"]:
                    store, key = ip_quotas, ip_entity_key(entry.entity[0].entity_name)
                    candidate = {key: store[key]} if key in store else {}
                    for op in entry.ops:
                        self.dynamic.alter_ip_quota(candidate, entry.entity[0].entity_name,
                                                    op.key, op.value, op.remove)
                elif kinds and len(set(kinds)) == len(kinds) and set(kinds) <= set(ENTITY_TYPES):
                    names = {e.entity_type: e.entity_name or DEFAULT for e in entry.entity}
                    store = client_quotas
                    key = entity_key(names.get("user"), names.get("client-id"))
                    candidate = {key: store[key]} if key in store else {}
                    for op in entry.ops:
                        alter_client_quota(candidate, key, op.key, op.value, op.remove)
                else:
                    raise ConfigProblem("invalid_request",
                                        f"entity {kinds} is not supported (ip, user, client-id)")
                if key in candidate and key not in store and \
                        len(ip_quotas) + len(client_quotas) >= MAX_QUOTA_ENTITIES:
                    raise ConfigProblem("invalid_request", f"{MAX_QUOTA_ENTITIES} quota entities "
                                                           f"are stored already (the most kept)")
                if key in candidate:
                    store[key] = candidate[key]
                else:
                    store.pop(key, None)
            except ConfigProblem as error:
                problem = (error.code, str(error))
            changed |= problem is None
            code, message = problem if problem is not None else (None, None)
            results.append({"error_code": error_code(code), "error_message": message,
                            "entity": entity})
        if changed and not body.validate_only:
            self.dynamic.stored.ip_quotas = ip_quotas
            self.dynamic.stored.client_quotas = client_quotas
            self.dynamic.save()
            # What this request changed, not the whole table (10,000 entities, half a MB a
            # line, for each change of one).
            changes = {}
            for entry, result in zip(body.entries, results):
                if result["error_code"] == ErrorCode.none:
                    entity = ",".join(f"{e.entity_type}={e.entity_name or DEFAULT}"
                                      for e in entry.entity)
                    changed_here = {f"{entity}/{op.key}": None if op.remove else op.value
                                    for op in entry.ops}
                    self._record(ctx.listener_index, who, "quota", changed_here)
                    changes.update(changed_here)
            log.info("quotas changed by %s: %s (%d entities held)", who or "a client", changes,
                     len(ip_quotas) + len(client_quotas))
            self.on_change()
        return ctx.respond({"throttle_time": NO_THROTTLE, "entries": results})


def _config_resources(resources) -> dict[tuple[int, str], list[str] | None]:
    """DescribeConfigs' resources, each once in the order first named, with the keys asked
    of it (each once; None: all of them, which any mention asking for all means)."""
    wanted: dict[tuple[int, str], dict[str, None] | None] = {}
    for resource in resources:
        key = (resource.resource_type, resource.resource_name)
        keys = resource.configuration_keys
        if not keys or (key in wanted and wanted[key] is None):
            wanted[key] = None
        else:
            wanted.setdefault(key, {}).update(dict.fromkeys(keys))
    return {key: None if keys is None else list(keys) for key, keys in wanted.items()}


def _filter_problem(components) -> tuple[str, str] | None:
    """Kafka's checks of a DescribeClientQuotas filter (ClientQuotasImage.describe): each
    entity type at most once, a known one, its match as its match type wants, and no ip
    beside a user or client id.  A filter is thus at most three components long."""
    seen: set[str] = set()
    for component in components:
        kind, match_type = component.entity_type, component.match_type
        if not kind:
            return "invalid_request", "Invalid empty entity type."
        if kind in seen:
            return ("invalid_request",
                    f"Entity type {kind} cannot appear more than once in the filter.")
        seen.add(kind)
        if kind not in QUOTA_ENTITY_TYPES:
            return "unsupported_version", f"Unsupported entity type {kind}"
        if match_type not in MATCH_TYPES:
            return "invalid_request", f"Unknown match type {match_type}"
        if match_type == MATCH_EXACT and component.match is None:
            return ("invalid_request",
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.")
        if match_type != MATCH_EXACT and component.match is not None:
            return ("invalid_request", f"Request specified {MATCH_TYPES[match_type]}, but also "
                                       f"specified a match string.")
    if "ip" in seen and len(seen) > 1:
        return "invalid_request", ("Invalid entity filter component combination. IP filter "
                                   "component should not be used with user or clientId filter "
                                   "component.")
    return None


def _duplicated(resource, named: collections.Counter) -> tuple[str, str] | None:
    """Kafka's ConfigAdminManager.preprocess: a resource named twice, or a key twice in one
    resource, is refused whole (each alteration is applied once, and its work stays
    proportional to the request)."""
    if named[(resource.resource_type, resource.resource_name)] > 1:
        return "invalid_request", "Each resource must appear at most once."
    keys = [item.name for item in resource.configs]
    if len(set(keys)) != len(keys):
        return "invalid_request", "Error due to duplicate config keys"
    return None


def _config_bytes(config: dict) -> int:
    """About what one DescribeConfigs entry takes in the answer."""
    return (len(config["name"]) + len(config["value"] or "")
            + len(config.get("documentation") or "")
            + sum(len(synonym["name"]) + len(synonym["value"] or "") + 8
                  for synonym in config.get("synonyms", ())))
