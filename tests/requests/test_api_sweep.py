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

from broker.shared.protocol.codec import build, encode_entity
from tests.batches import make_batch
from tests.helpers import make_router
from tests.requests.helpers import Parent, ask_in_loop
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
        answer = ask_in_loop(loop, router, frame)
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
    assert isinstance(ask_in_loop(loop, router, create), bytes)
    grow = request(37, 3, {"topics": [{"name": "grown", "count": 69, "assignments": None}],
                           "timeout": datetime.timedelta(0), "validate_only": False})
    answer = ask_in_loop(loop, router, grow)
    assert isinstance(answer, asyncio.Future) and answer.cancelled()
    registry = router.apis[37].services.registry
    assert registry.get("grown").partitions == 1  # cancelled mid-build: nothing committed


def test_a_memoized_request_shortened_by_skipping_unknown_tags_is_answered(services):
    """Found by the router fuzz target in CI: an ApiVersions frame too long for the memo
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
        answer = ask_in_loop(loop, router, found)
    except InvalidRequest:  # refusing it is fine too; a crash of the handler is not
        return
    assert isinstance(answer, bytes) and answer[4:8] == found[4:8]  # size, then correlation
