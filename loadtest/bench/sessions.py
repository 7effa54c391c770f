"""Fetch sessions (KIP-227) in one worker's router: a consumer of 500 partitions polling for
news, with a session (incremental fetches) and without (full fetches), interleaved ABBA.

Every 10th round one partition gets a record, so the incremental answers are not all empty.
Figures: requests per second through the router, and bytes per round trip (request frame plus
answer frame), as a consumer's network would carry them.
"""

from __future__ import annotations

import datetime
import tempfile
import time

PARTITIONS = 500


def fetch_session_costs(rounds: int = 3, requests: int = 300) -> dict[str, dict]:
    from broker.shared.config import load_config
    from broker.shared.log.settings import LogSettings
    from broker.shared.log.topics import Epoch, TopicRegistry
    from tests.batches import make_batch
    from tests.wire import request
    from workers.apis import Services, build_apis
    from workers.fetch_sessions import FetchSessionCache
    from workers.router import BrokerView, Router

    props = load_config({}).props
    figures = {f"sessions {label}": {"count": 0, "seconds": 0.0, "errors": 0, "server_cpu": 0.0,
                                     "bytes": 0} for label in ("on", "off")}
    with tempfile.TemporaryDirectory(prefix="pybroker-bench-sessions-") as directory:
        registry = TopicRegistry((directory,), LogSettings(), Epoch())
        registry.create("wide", PARTITIONS)
        sessions = FetchSessionCache(10, 10, 0, 1, props.pybroker_request_max_entries, 100_000)
        router = Router(build_apis(Services(
            view=BrokerView(node_id=0, cluster_id="bench", advertised=(("h", 1),)),
            props=props, registry=registry, sessions=sessions)))
        offsets = [0] * PARTITIONS

        def fetch(session_id: int, epoch: int, named: dict[int, int]) -> tuple[int, int]:
            frame = request(1, 12, {
                "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 0,
                "max_bytes": 1 << 24, "isolation_level": 0, "session_id": session_id,
                "session_epoch": epoch, "rack_id": "", "forgotten_topics_data": [],
                "topics": [{"topic": "wide", "partitions": [
                    {"partition": index, "current_leader_epoch": -1, "fetch_offset": offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1,
                     "partition_max_bytes": 1 << 20} for index, offset in named.items()]}]
                if named else []})
            answer = router.handle(frame, 0)
            # Fetch v12's answer: size, correlation id, tags (1 byte), throttle, error, session.
            if int.from_bytes(answer[13:15], "big"):
                figures[f"sessions {label}"]["errors"] += 1
            return len(frame) + 4 + len(answer), int.from_bytes(answer[15:19], "big")

        produce = request(0, 9, {"transactional_id": None, "acks": 1,
                                 "timeout": datetime.timedelta(seconds=5), "topic_data": [
                                     {"name": "wide", "partition_data": [
                                         {"index": 0, "records": make_batch(1)}]}]})
        for _ in range(rounds):
            for label in ("on", "off", "off", "on"):
                figure = figures[f"sessions {label}"]
                session_id, epoch = 0, 0
                if label == "on":  # opened outside the timing, as a consumer's first fetch
                    _size, session_id = fetch(0, 0, dict(enumerate(offsets)))
                    epoch = 1
                started, cpu = time.perf_counter(), time.process_time()
                for number in range(requests):
                    moved = {}
                    if number % 10 == 0:
                        router.handle(produce, 0)
                        offsets[0] += 1
                        moved = {0: offsets[0]}
                    if label == "on":
                        size, _ = fetch(session_id, epoch, moved)
                        epoch += 1
                    else:
                        size, _ = fetch(0, -1, dict(enumerate(offsets)))
                    figure["bytes"] += size
                figure["count"] += requests
                figure["seconds"] += time.perf_counter() - started
                figure["server_cpu"] += time.process_time() - cpu
    return figures
