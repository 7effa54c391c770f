"""CreateTopics and DeleteTopics.

With a control plane (KIP-291), both are served only on its listener unless
`pybroker.control.plane.alter.on.data.listeners` is set; elsewhere every topic gets
CLUSTER_AUTHORIZATION_FAILED, the answer an authorizer gives to a principal without
cluster-level alter rights.
"""

from __future__ import annotations

from workers.handlers import NO_THROTTLE, Api, RequestContext, error_code

_MESSAGES = {
    "topic_already_exists": "Topic '{}' already exists.",
    "invalid_topic_exception": "Topic name '{}' is illegal: use [a-zA-Z0-9._-], 1 to 249 chars.",
    "invalid_partitions": "Number of partitions must be larger than 0.",
    "invalid_replication_factor": "Replication factor must be 1: this cluster has one broker.",
    "invalid_replica_assignment": "Replica assignments may only name this broker.",
    "invalid_config": "Topic-level configurations are not supported yet.",
    "cluster_authorization_failed": "Topics are created and deleted on the control-plane "
                                    "listener only.",
}


def _refused(services, ctx: RequestContext) -> bool:
    return services.may_alter is not None and not services.may_alter(ctx.listener_index)


class CreateTopics(Api):
    key, name, versions = 19, "CreateTopics", (2, 7)

    def handle(self, ctx: RequestContext, body) -> bytes:
        if _refused(self.services, ctx):
            results = [self._refusal(topic.name) for topic in body.topics]
        else:
            results = [self._create(topic, body.validate_only) for topic in body.topics]
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": results})

    @staticmethod
    def _refusal(name: str) -> dict:
        return {"name": name, "topic_id": None, "num_partitions": -1, "replication_factor": -1,
                "error_code": error_code("cluster_authorization_failed"),
                "error_message": _MESSAGES["cluster_authorization_failed"], "configs": (),
                "topic_config_error_code": 0}

    def _create(self, topic, validate_only: bool) -> dict:
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
        if problem is None and topic.configs:
            problem = "invalid_config"
        if problem is None:
            problem = registry.create(topic.name, partitions, validate_only)
        info = registry.get(topic.name) if problem is None else None
        return {
            "name": topic.name,
            "topic_id": info.topic_id if info is not None else None,
            "error_code": error_code(problem),
            "error_message": _MESSAGES.get(problem, problem or "").format(topic.name) or None,
            "num_partitions": partitions if problem is None else -1,
            "replication_factor": 1 if problem is None else -1,
            "configs": (),
            "topic_config_error_code": 0,
        }


class DeleteTopics(Api):
    key, name, versions = 20, "DeleteTopics", (1, 6)

    def handle(self, ctx: RequestContext, body) -> bytes:
        registry = self.services.registry
        if ctx.version >= 6:
            wanted = [(t.name, t.topic_id) for t in body.topics]
        else:
            wanted = [(name, None) for name in body.topic_names]
        results = []
        for name, topic_id in wanted:
            if _refused(self.services, ctx):
                results.append({"name": name, "topic_id": topic_id, "error_message":
                                _MESSAGES["cluster_authorization_failed"],
                                "error_code": error_code("cluster_authorization_failed")})
                continue
            if name is None and topic_id is not None:
                info = registry.by_id(topic_id)
                name = info.name if info is not None else None
            problem = registry.delete(name) if name is not None else "unknown_topic_id"
            results.append({"name": name, "topic_id": topic_id, "error_code": error_code(problem),
                            "error_message": None})
        return ctx.respond({"throttle_time": NO_THROTTLE, "responses": results})
