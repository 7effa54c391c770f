"""acls: the cost of authorization on the hot path, in one pass: two brokers of 2
workers with one SASL_PLAINTEXT listener (PLAIN), the same but for `authorizer.class.name`.
With it on, the broker holds 1,000 ACLs: 998 for other principals and topics, and the two
that let the client in - WRITE and READ on the PREFIXED pattern "bench-".

  produce   confluent-kafka 1 KiB records (loadtest/kafka_load.py), MB/s;
  fetch     Fetch requests per second on an empty partition, max_wait 0
            (loadtest/secure_client.py, 2 processes x 10 connections x 20 in flight).

Each as authorizer on / off, the goal being >= 0.95.  Both brokers run through the pass and
are measured in turn (a warm-up each, then three times off-on-on-off, each window half of
--seconds).  On this 2-core machine the clients
share the cores with the broker, so these end-to-end ratios move by +-10 % between passes;
hence also, in process, the worker's own time per Produce and per Fetch through the real
router with the same 1,000 ACLs, on and off interleaved (`handler` rows): the cost of the
checks themselves, without the machine's noise.
"""

from __future__ import annotations

import json

from loadtest.bench.common import cpu_seconds
from loadtest.bench.log import run_kafka_load
from loadtest.bench.security import _clients
from tests.harness import BrokerProcess

ACLS = 1000
CYCLES = 3  # off-on-on-off cycles per pass: the log's writes slow both brokers as it grows
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="admin" password="admin-secret" user_admin="admin-secret" '
        'user_bench="bench-secret";')


def authorization_costs(seconds: float) -> dict[str, dict]:
    """Both brokers run at once; each figure is measured in windows of seconds/2, CYCLES
    times off-on-on-off, and summed, so a drift of the machine during the pass (the page
    cache filling with the produced log slows both) cancels out."""
    with _broker({}) as off, _broker({
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin"}) as on:
        brokers = {"off": off, "on": on}
        for label, broker in brokers.items():
            host, port = broker.listeners["SASL_PLAINTEXT"]
            _topics(_config(host, port, "admin"), "bench-produce", "bench-fetch")
            if label == "on":
                _acls(_config(host, port, "admin"))
        figures = {f"acl {kind} {label}": {"count": 0, "seconds": 0.0, "errors": 0,
                                           "server_cpu": 0.0}
                   for kind in ("produce", "fetch") for label in brokers}
        # The first window of a fresh broker runs cold (page cache, first segments): a
        # warm-up of each, not counted, then the measured windows.
        for label in ("warm off", "warm on") + ("off", "on", "on", "off") * CYCLES:
            broker = brokers[label.split()[-1]]
            host, port = broker.listeners["SASL_PLAINTEXT"]
            pids = [broker.pid, *broker.worker_pids.values()]
            before = cpu_seconds(pids)
            window = seconds / 2
            produced = run_kafka_load("produce", f"{host}:{port}", "bench-produce", window,
                                      1024, json.dumps(_config(host, port, "bench", False)))
            middle = cpu_seconds(pids)
            fetched = _clients("fetch", (host, port), window,
                               (10, 20, "bench", "bench-secret", "bench-fetch"), None)
            if label.startswith("warm"):
                continue
            _add(figures[f"acl produce {label}"], produced["records"], produced["seconds"],
                 produced["failed"], middle - before)
            _add(figures[f"acl fetch {label}"], fetched["count"], fetched["seconds"],
                 fetched["errors"], cpu_seconds(pids) - middle)
    return figures


def handler_costs(rounds: int = 5, requests: int = 4000) -> dict[str, dict]:
    """Microseconds per request through a worker's router (no sockets), on and off."""
    import tempfile
    import time

    from broker.shared.access import Access
    from broker.shared.config import load_config
    from broker.shared.log.settings import LogSettings
    from broker.shared.log.topics import Epoch, TopicRegistry
    from tests.batches import make_batch
    from tests.wire import fetch_request, produce_request
    from workers.apis import Services, build_apis
    from workers.router import BrokerView, Router

    figures = {f"handler {kind} {label}": {"count": 0, "seconds": 0.0, "errors": 0,
                                           "server_cpu": 0.0}
               for kind in ("produce", "fetch") for label in ("off", "on")}
    with tempfile.TemporaryDirectory(prefix="pybroker-bench-acl-") as directory:
        registry = TopicRegistry((directory,), LogSettings(), Epoch())
        registry.create("bench-produce", 1)
        registry.create("bench-fetch", 1)
        frames = {"produce": produce_request("bench-produce", make_batch(1))[4:],
                  "fetch": fetch_request("bench-fetch")[4:]}
        routers = {}
        for label in ("off", "on"):
            access = Access(label == "on")
            access.update(_acl_list())
            routers[label] = Router(build_apis(Services(
                view=BrokerView(node_id=0, cluster_id="bench", advertised=(("h", 1),)),
                props=load_config({}).props, registry=registry, access=access)))
        for _ in range(rounds):
            for label in ("off", "on", "on", "off"):
                for kind, frame in frames.items():
                    handle, started = routers[label].handle, time.perf_counter()
                    for _ in range(requests):
                        handle(frame, 0, "bench", "127.0.0.1")
                    _add(figures[f"handler {kind} {label}"], requests,
                         time.perf_counter() - started, 0, time.perf_counter() - started)
    return figures


def _acl_list():
    from broker.shared.acl import Acl, Operation, PatternType, Permission, ResourceType

    acls = [Acl(ResourceType.TOPIC, f"team-{index % 50}-topic-{index}",
                PatternType.LITERAL if index % 2 else PatternType.PREFIXED,
                f"User:service-{index}", "*",
                Operation.READ if index % 3 else Operation.WRITE, Permission.ALLOW)
            for index in range(ACLS - 2)]
    return acls + [Acl(ResourceType.TOPIC, "bench-", PatternType.PREFIXED, "User:bench", "*",
                       operation, Permission.ALLOW)
                   for operation in (Operation.WRITE, Operation.READ)]


def _broker(extra: dict) -> BrokerProcess:
    return BrokerProcess(workers=2, overrides={
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS, **extra})


def _add(figure: dict, count: int, seconds: float, errors: int, cpu: float) -> None:
    figure["count"] += count
    figure["seconds"] += seconds
    figure["errors"] += errors
    figure["server_cpu"] += cpu


def _config(host: str, port: int, user: str, bootstrap: bool = True) -> dict:
    config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
              "sasl.username": user, "sasl.password": f"{user}-secret"}
    if bootstrap:
        config["bootstrap.servers"] = f"{host}:{port}"
    return config


def _topics(config: dict, *names: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(name, 2, 1) for name in names]).values():
        future.result(timeout=30)


def _acls(config: dict) -> None:
    """The same 1,000 ACLs as the in-process rows, through CreateAcls."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                       AdminClient, ResourcePatternType, ResourceType)

    bindings = [AclBinding(ResourceType(acl.resource_type), acl.resource_name,
                           ResourcePatternType(acl.pattern_type), acl.principal, acl.host,
                           AclOperation(acl.operation), AclPermissionType(acl.permission))
                for acl in _acl_list()]
    admin = AdminClient(config)
    for start in range(0, len(bindings), 200):
        for future in admin.create_acls(bindings[start:start + 200]).values():
            future.result(timeout=30)
