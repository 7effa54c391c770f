"""Every API version the broker advertises, with arbitrary field values, gets an answer.

A sweep over `ApiVersions`: for each advertised (key, version), hypothesis draws whole
requests from kio's schema classes (any field values the wire can carry) and the real router
(worker side) or the parent's services (config, quota and group APIs) answer them in process.
The only failure allowed is InvalidRequest, which closes the connection with a metric; any
other exception is a request that would have cost its client the connection for a bug (as
Fetch v4-6 once did, reading a `session_id` those versions do not have).
"""

import asyncio
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import Records

from broker.parent.admin import AdminService
from broker.parent.dynamic import DynamicConfig
from broker.parent.forwarded import ForwardedRouter
from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offsets import OffsetStore
from broker.parent.transactions.coordinator import TransactionCoordinator
from broker.shared.config import load_config
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from broker.shared.protocol.codec import build, encode_entity
from tests.batches import make_batch
from tests.helpers import make_router
from workers.fetch_response import FileResponse
from workers.router import ForwardRequest, InvalidRequest

st.register_type_strategy(Records, st.sampled_from([b"", make_batch(1), b"\0" * 70]).map(Records))

def advertised():
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        served = make_router(directory).served()
    return [(key, version) for key, (low, high) in sorted(served.items())
            for version in range(low, high + 1)]


def frame_of(api_key: int, version: int, body) -> bytes:
    cls = load_request_schema(api_key, version)
    header = build(cls.__header_schema__, {"request_api_key": api_key, "request_api_version":
                                           version, "correlation_id": 7, "client_id": "sweep"})
    buffer = io.BytesIO()
    entity_writer(cls)(buffer, body)
    return encode_entity(header) + buffer.getvalue()


class Parent:
    """The parent's services that answer forwarded requests, on a private loop."""

    def __init__(self, directory: str):
        config = load_config({"log.dirs": directory, "group.initial.rebalance.delay.ms": "0"})
        self.loop = asyncio.new_event_loop()
        self.admin = AdminService(0, DynamicConfig(config), on_change=lambda: None)
        offsets = OffsetStore(directory)
        self.groups = GroupCoordinator(self.loop, config.props, offsets, {"t": 1}.get)
        self.registry = TopicRegistry((directory,), LogSettings(), Epoch())
        self.transactions = TransactionCoordinator(self.loop, config.props, directory,
                                                   self.registry, offsets)
        self.groups.transaction_problem = self.transactions.offsets_problem
        self.router = ForwardedRouter(self.admin, self.groups, self.transactions, None)

    def close(self) -> None:
        self.groups.close()
        self.transactions.close()
        self.registry.close()
        self.loop.close()

    def handle(self, frame: bytes):
        service = self.router.service_for(int.from_bytes(frame[:2], "big"))
        return service.handle(frame, 0, "127.0.0.1:1")


def ask(loop: asyncio.AbstractEventLoop, router, frame: bytes):
    """The router's answer to a frame, asked as a worker asks: inside its running loop.  An
    answer that would take more turns (a long poll, a rebalance wait, CreatePartitions built
    a slice per turn) is cancelled, and the loop turned once so its work sees that and stops."""
    async def once():
        answer = router.handle(memoryview(frame).toreadonly(), 0)
        if isinstance(answer, asyncio.Future):
            answer.cancel()
            await asyncio.sleep(0)
        return answer
    return loop.run_until_complete(once())


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    parent = Parent(str(tmp_path_factory.mktemp("parent")))
    loop = asyncio.new_event_loop()
    yield make_router(str(tmp_path_factory.mktemp("worker"))), parent, loop
    loop.close()
    parent.close()


@pytest.mark.parametrize("api_key, version", advertised())
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_advertised_version_is_answered(services, api_key, version, data):
    router, parent, loop = services
    body = data.draw(st.from_type(load_request_schema(api_key, version)))
    frame = frame_of(api_key, version, body)
    try:
        answer = ask(loop, router, frame)
    except InvalidRequest:
        return  # closed with a metric: what Kafka does with requests it cannot serve
    if isinstance(answer, ForwardRequest):
        answer = parent.handle(answer.frame)
    if isinstance(answer, FileResponse):  # a zero-copy Fetch answer: it must read back whole
        answer = answer.materialize()
    assert answer is None or isinstance(answer, (bytes, asyncio.Future)) or \
        type(answer).__name__ == "Throttled"


def test_a_create_partitions_built_over_several_turns_is_asked_inside_the_loop(services):
    """What the sweep once drew (CreatePartitions growing an existing topic by 68, more than
    one loop turn builds): a worker always has a running loop, and so does the sweep now."""
    import datetime

    from tests.wire import request

    router, _parent, loop = services
    create = request(19, 5, {"topics": [{"name": "grown", "num_partitions": 1,
                                         "replication_factor": 1, "assignments": [],
                                         "configs": []}],
                             "timeout": datetime.timedelta(seconds=5), "validate_only": False})
    assert isinstance(ask(loop, router, create), bytes)
    grow = request(37, 3, {"topics": [{"name": "grown", "count": 69, "assignments": None}],
                           "timeout": datetime.timedelta(0), "validate_only": False})
    answer = ask(loop, router, grow)
    assert isinstance(answer, asyncio.Future) and answer.cancelled()
    registry = router.apis[37].services.registry
    assert registry.get("grown").partitions == 1  # cancelled mid-build: nothing committed


def test_a_memoized_request_shortened_by_skipping_unknown_tags_is_answered(services):
    """Found by the handlers fuzz target in CI: an ApiVersions frame too long for the memo
    whose unknown tagged fields, once skipped, left it short enough raised UnboundLocalError
    (the memo's key was never taken)."""
    import base64

    found = base64.b64decode(
        "ABIABAAAAAEAAAkACQAAAAcABwQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBA"
        "QEBAQEBAQEBAQEBAQEBAQABwQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE"
        "BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBBNrYWZrYf////////////////////////////////////////////"
        "//////////////////////////////////////////////////////////////////////////////////////"
        "////////////////////////////LXB5dGhvbi0zLjAuMTIADWthZmthLXB5dGhveQQEBAQEAQAAAHRob24HMy"
        "4CAAAwE2EBAC4wNgA=")
    router, _parent, loop = services
    try:
        answer = ask(loop, router, found)
    except InvalidRequest:  # refusing it is fine too; a crash of the handler is not
        return
    assert isinstance(answer, bytes) and answer[4:8] == found[4:8]  # size, then correlation
