"""CreateTopics, DeleteTopics and CreatePartitions.

With a control plane (KIP-291), both are served only on its listener unless
`pybroker.control.plane.alter.on.data.listeners` is set; elsewhere every topic gets
CLUSTER_AUTHORIZATION_FAILED, the answer an authorizer gives to a principal without
cluster-level alter rights.  With ACLs, creating needs CREATE on the cluster or on the topic,
deleting DELETE on the cluster or DESCRIBE then DELETE on the topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import asyncio
import datetime
import logging

from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.log import topic_config
from broker.shared.protocol.errors import ErrorCode
from workers.router import NO_THROTTLE, Api, RequestContext, error_code

log = logging.getLogger("workers.apis.topics")
SLICE_PARTITIONS = 32  # partitions built per event-loop turn (about 10 ms of work)
RETRY_AFTER = datetime.timedelta(seconds=1)

_MESSAGES = {
    "topic_already_exists": "Topic '{}' already exists.",
    "invalid_topic_exception": "Topic name '{}' is illegal: use [a-zA-Z0-9._-], 1 to 249 chars.",
    "invalid_partitions": "Number of partitions must be between 1 and "
                          "pybroker.max.partitions.per.topic.",
    "invalid_request": "Topic '{}' appears more than once in the request.",
    "kafka_storage_error": "The partitions of '{}' could not be written.",
    "throttling_quota_exceeded": "One request creates at most pybroker.max.partitions.per.topic "
                                 "partitions; ask again for '{}'.",
    "invalid_replication_factor": "Replication factor must be 1: this cluster has one broker.",
    "invalid_replica_assignment": "Replica assignments may only name this broker.",
    "cluster_authorization_failed": "Topics are created and deleted on the control-plane "
                                    "listener only.",
    "topic_authorization_failed": "Authorization failed.",
}


def _refused(services, ctx: RequestContext) -> bool:
    return services.may_alter is not None and not services.may_alter(ctx.listener_index)


def _may_create(access, ctx: RequestContext):
    """(topic name) -> may the principal create it: CREATE on the cluster or on the topic."""
    if access.allowed(ctx, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME):
        return lambda name: True
    return lambda name: access.check(ctx, Operation.CREATE, ResourceType.TOPIC, name)


class CreateTopics(Api, api="CreateTopics"):
    """Topics are built a slice of partitions per event-loop turn when they are many, so a
    request for thousands of partitions never holds the worker; their directories appear at
    once, under the topics lock, when all are built (broker.shared.log.topics.Staging).  One request
    creates at most pybroker.max.partitions.per.topic partitions in all: topics past that get
    THROTTLING_QUOTA_EXCEEDED and a throttle time (KIP-599), so clients ask again."""

    def handle(self, ctx: RequestContext, body):
        if _refused(self.services, ctx):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "topics": [self._refusal(topic.name) for topic in body.topics]})
        duplicated = _duplicates(topic.name for topic in body.topics)
        counts = self.services.registry.log_dir_counts()
        budget = self.services.props.pybroker_max_partitions_per_topic
        plans = []
        may_create = _may_create(self.services.access, ctx)
        for topic in body.topics:
            if topic.name in duplicated:
                continue
            if not may_create(topic.name):
                plans.append(_Plan(topic.name, -1, "topic_authorization_failed", None))
                continue
            plan = self._plan(topic, body.validate_only, counts)
            if plan.staging is not None:  # the request's budget: the rest waits for a retry
                if plan.partitions > budget:
                    plan.problem, plan.staging = "throttling_quota_exceeded", None
                budget -= plan.partitions
            plans.append(plan)
        plans += [_Plan(name, -1, "invalid_request", None) for name in sorted(duplicated)]
        building = [plan.staging for plan in plans if plan.staging is not None]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (in-process use): build everything now
            loop = None
        if loop is None or sum(item.partitions for item in building) <= SLICE_PARTITIONS:
            for staging in building:
                self._build(plans, staging, staging.partitions)
            return self._answer(ctx, plans)
        future = loop.create_future()
        loop.call_soon(self._build_slice, ctx, plans, building, future)
        return future

    def _build_slice(self, ctx: RequestContext, plans: list, building: list, future) -> None:
        if future.done():  # the connection went away: drop what was staged
            for staging in building:
                staging.abort()
            return
        budget = SLICE_PARTITIONS
        while building and budget > 0:
            staging = building[0]
            before = len(staging.built)
            self._build(plans, staging, budget)
            budget -= max(1, len(staging.built) - before)
            if staging.done or not staging.built:
                building.pop(0)
        if building:
            asyncio.get_running_loop().call_soon(self._build_slice, ctx, plans, building, future)
        else:
            future.set_result(self._answer(ctx, plans))

    @staticmethod
    def _build(plans: list, staging, count: int) -> None:
        try:
            staging.build(count)
        except OSError as error:  # e.g. the disk is full: this topic fails, the rest goes on
            log.error("creating topic %s failed: %s", staging.name, error)
            staging.abort()
            for plan in plans:
                if plan.staging is staging:
                    plan.problem, plan.staging = "kafka_storage_error", None

    def _answer(self, ctx: RequestContext, plans: list) -> bytes:
        staged = [plan for plan in plans if plan.staging is not None]
        for plan, problem in zip(staged, self.services.registry.commit(
                [plan.staging for plan in staged])):
            plan.problem = problem
            if problem is None:
                topic_config.note_inert(log, plan.name, plan.configs)
        results = []
        throttled = False
        for plan in plans:
            throttled |= plan.problem == "throttling_quota_exceeded"
            info = self.services.registry.get(plan.name) if plan.problem is None else None
            configs, config_code = self._configs(ctx, plan)
            results.append({
                "name": plan.name,
                "topic_id": info.topic_id if info is not None else None,
                "error_code": error_code(plan.problem),
                "error_message": plan.message or _message(plan.problem, plan.name),
                "num_partitions": plan.partitions if plan.problem is None else -1,
                "replication_factor": 1 if plan.problem is None else -1,
                "configs": configs,
                "topic_config_error_code": config_code,
            })
        # KIP-599: a client whose topics were left for later hears when to ask again.
        return ctx.respond({"throttle_time": RETRY_AFTER if throttled else NO_THROTTLE,
                            "topics": results})

    def _configs(self, ctx: RequestContext, plan: "_Plan"):
        """CreateTopics v5+ tells the created topic's configs, to a principal that may
        DESCRIBE_CONFIGS it (else TOPIC_AUTHORIZATION_FAILED in their place, as Kafka)."""
        if plan.problem is not None or ctx.version < 5:
            return (), 0
        if not self.services.access.allowed(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC,
                                            plan.name):
            return (), ErrorCode.topic_authorization_failed
        return [{key: entry[key] for key in ("name", "value", "read_only", "config_source",
                                             "is_sensitive")}
                for entry in topic_config.describe(self.services.props, plan.configs)], 0

    @staticmethod
    def _refusal(name: str) -> dict:
        return {"name": name, "topic_id": None, "num_partitions": -1, "replication_factor": -1,
                "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": _MESSAGES["cluster_authorization_failed"], "configs": (),
                "topic_config_error_code": 0}

    def _plan(self, topic, validate_only: bool, counts: dict) -> "_Plan":
        props, registry = self.services.props, self.services.registry
        partitions = topic.num_partitions if topic.num_partitions != -1 else props.num_partitions
        replication = topic.replication_factor if topic.replication_factor != -1 \
            else props.default_replication_factor
        problem = None
        if topic.assignments:
            partitions = len(topic.assignments)
            if any(tuple(a.broker_ids) != (self.services.view.node_id,) for a in topic.assignments):
                problem = "invalid_replica_assignment"
        elif replication != 1:
            problem = "invalid_replication_factor"
        own, message = {}, None
        if problem is None and topic.configs:
            try:
                for item in topic.configs:
                    own[item.name] = topic_config.validate(item.name, item.value)
            except topic_config.TopicConfigError as error:
                problem, message = "invalid_config", str(error)
        if problem is None:
            problem = registry.check_new(topic.name, partitions,
                                         props.pybroker_max_partitions_per_topic)
        staging = None
        if problem is None and not validate_only:
            staging = registry.staging(topic.name, partitions, counts, own)
        return _Plan(topic.name, partitions, problem, staging, message, own)


class _Plan:
    """One topic of a CreateTopics request: what it asks for and how far it got."""

    __slots__ = ("name", "partitions", "problem", "staging", "message", "configs")

    def __init__(self, name: str, partitions: int, problem: str | None, staging,
                 message: str | None = None, configs: dict[str, str] | None = None):
        self.name, self.partitions, self.problem, self.staging = name, partitions, problem, staging
        self.message = message  # a message of its own (an invalid config names itself)
        self.configs = configs or {}  # its own topic configs


def _duplicates(names) -> set[str]:
    """Names given more than once: Kafka refuses each with INVALID_REQUEST, acting on none."""
    seen, repeated = set(), set()
    for name in names:
        (repeated if name in seen else seen).add(name)
    return repeated


def _message(problem: str | None, name: str) -> str | None:
    if problem is None:
        return None
    return _MESSAGES.get(problem, problem).format(name)


class DeleteTopics(Api, api="DeleteTopics"):

    def handle(self, ctx: RequestContext, body) -> bytes:
        registry = self.services.registry
        if ctx.version >= 6:
            wanted = [(t.name, t.topic_id) for t in body.topics]
        else:
            wanted = [(name, None) for name in body.topic_names]
        if _refused(self.services, ctx):
            return ctx.respond({"throttle_time": NO_THROTTLE, "responses": [
                {"name": name, "topic_id": topic_id, "error_code":
                 ErrorCode.cluster_authorization_failed,
                 "error_message": _MESSAGES["cluster_authorization_failed"]}
                for name, topic_id in wanted]})
        malformed = _malformed(wanted)
        resolved = []
        for name, topic_id in wanted:
            if name is None and topic_id is not None:
                info = registry.by_id(topic_id)
                name = info.name if info is not None else None
            resolved.append((name, topic_id))
        named = [name for index, (name, _) in enumerate(resolved)
                 if name is not None and index not in malformed]
        denied = self._denied(ctx, named)
        duplicated = _duplicates(named)
        doomed = list(dict.fromkeys(name for name in named
                                    if name not in duplicated and name not in denied))
        outcomes = dict(zip(doomed, registry.delete_many(doomed)))  # one hold of the lock
        results = []
        for index, (name, topic_id) in enumerate(resolved):
            if index in malformed:
                results.append({"name": name, "topic_id": topic_id, "error_code":
                                ErrorCode.invalid_request, "error_message": malformed[index]})
                continue
            problem = ("unknown_topic_id" if name is None else "invalid_request"
                       if name in duplicated else "topic_authorization_failed"
                       if name in denied else outcomes[name].problem)
            if problem is None:
                topic_id = outcomes[name].topic_id  # Kafka names the id deleted, asked by name too
            if name in denied and denied[name] and topic_id is not None:
                name = None  # asked by id, not even describable: its name is not told
            results.append({"name": name, "topic_id": topic_id, "error_code": error_code(problem),
                            "error_message": None})
        return ctx.respond({"throttle_time": NO_THROTTLE, "responses": results})

    def _denied(self, ctx: RequestContext, names: list[str]) -> dict[str, bool]:
        """Names the principal may not delete -> whether it may not even DESCRIBE them.
        DELETE on the cluster allows every topic; else DESCRIBE, then DELETE on the topic
        (Kafka's order: an undescribable topic is refused whether it exists or not)."""
        access = self.services.access
        if access.allowed(ctx, Operation.DELETE, ResourceType.CLUSTER, CLUSTER_NAME):
            return {}
        denied = {}
        for name in dict.fromkeys(names):
            if not access.check(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name):
                denied[name] = True
            elif self.services.registry.get(name) is not None and not access.check(
                    ctx, Operation.DELETE, ResourceType.TOPIC, name):
                denied[name] = False
        return denied


def _malformed(wanted: list) -> dict[int, str]:
    """Entries of a DeleteTopics v6+ request that Kafka refuses (INVALID_REQUEST) before any
    lookup, by index: a topic is named by its name or by its id, exactly one of them."""
    malformed = {}
    for index, (name, topic_id) in enumerate(wanted):
        if name is not None and topic_id is not None:
            malformed[index] = "You may not specify both topic name and topic id."
        elif name is None and topic_id is None:
            malformed[index] = "Neither topic name nor id were specified."
    return malformed


class CreatePartitions(Api, api="CreatePartitions"):
    """Grow topics (ALTER on the topic): consumers see the new partitions at their next
    Metadata; a group rebalances onto them as its members notice.  As for CreateTopics, the
    new partitions are built SLICE_PARTITIONS per event-loop turn, so a request for thousands
    never holds the worker."""

    def handle(self, ctx: RequestContext, body):
        names = [topic.name for topic in body.topics]
        if _refused(self.services, ctx):
            return self._answer(ctx, [[name, "cluster_authorization_failed",
                                       _MESSAGES["cluster_authorization_failed"], None]
                                      for name in names])
        duplicated = _duplicates(names)
        results = []  # [name, error name, message, staging to build and commit]
        for topic in body.topics:
            if topic.name in duplicated:
                results.append([topic.name, "invalid_request", "Duplicate topic in request.",
                                None])
                continue
            outcome = self._stage(ctx, topic)
            if isinstance(outcome, tuple):
                results.append([topic.name, *outcome, None])
            else:
                results.append([topic.name, None, None,
                                None if body.validate_only else outcome])
        building = [row for row in results if row[3] is not None]
        if sum(row[3].partitions - row[3].first for row in building) <= SLICE_PARTITIONS:
            for row in building:
                row[3].build(row[3].partitions)
            return self._finish(ctx, results)
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(self._build_slice, ctx, results, building, future)
        return future

    def _stage(self, ctx: RequestContext, topic):
        """A Staging of the topic's new partitions, or (error name, message)."""
        services = self.services
        if not services.access.check(ctx, Operation.ALTER, ResourceType.TOPIC, topic.name):
            return "topic_authorization_failed", _MESSAGES["topic_authorization_failed"]
        info = services.registry.get(topic.name)
        if topic.assignments is not None and info is not None:
            node = services.view.node_id
            if len(topic.assignments) != topic.count - info.partitions or any(
                    tuple(item.broker_ids) != (node,) for item in topic.assignments):
                return "invalid_replica_assignment", _MESSAGES["invalid_replica_assignment"]
        return services.registry.partition_staging(
            topic.name, topic.count, services.props.pybroker_max_partitions_per_topic)

    def _build_slice(self, ctx: RequestContext, results: list, building: list, future) -> None:
        if future.done():  # the connection went away: drop what was built
            for row in building:
                row[3].abort()
            return
        budget = SLICE_PARTITIONS
        while building and budget > 0:
            staging = building[0][3]
            before = len(staging.built)
            try:
                staging.build(budget)
            except OSError as error:  # e.g. the disk is full: this topic fails, the rest go on
                log.error("adding partitions to %s failed: %s", staging.name, error)
                staging.abort()
                building[0][1:] = ["kafka_storage_error", str(error), None]
                building.pop(0)
                continue
            budget -= max(1, len(staging.built) - before)
            if staging.done:
                building.pop(0)
        if building:
            asyncio.get_running_loop().call_soon(self._build_slice, ctx, results, building,
                                                 future)
        else:
            future.set_result(self._finish(ctx, results))

    def _finish(self, ctx: RequestContext, results: list) -> bytes:
        for row in results:
            if row[3] is not None:
                problem = self.services.registry.commit_partitions(row[3])
                row[1:] = [*(problem or (None, None)), None]
        return self._answer(ctx, results)

    @staticmethod
    def _answer(ctx: RequestContext, results: list) -> bytes:
        return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
            {"name": name, "error_code": error_code(code), "error_message": message}
            for name, code, message, _staging in results]})
