"""Property tests (hypothesis): hostile bytes never escape as anything but a refusal."""

import struct

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.shared.config import ConfigError, load_config, parse_properties
from broker.shared.log import records
from tests.batches import make_batch
from tests.helpers import connect, feed
from tests.wire import api_versions_request, metadata_request

VALID = [api_versions_request(3, correlation_id=1), api_versions_request(0, correlation_id=2),
         metadata_request(12, correlation_id=3, topics=["t"])]

frames = st.one_of(
    st.sampled_from(VALID),
    st.binary(max_size=64).map(lambda body: struct.pack(">i", len(body)) + body),
    st.binary(max_size=80),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames, max_size=8), st.integers(min_value=1, max_value=40))
def test_any_byte_stream_is_answered_or_closed_never_raised(parts, chunk):
    conn, transport, worker = connect(max_request_bytes=4096)
    feed(conn, b"".join(parts), chunk)  # must not raise
    data = b"".join(transport.writes)
    while data:  # whatever was written is a sequence of whole, well-formed frames
        size = struct.unpack_from(">i", data)[0]
        assert 4 <= size <= len(data) - 4
        data = data[4 + size:]
    if not transport.closed:
        assert not worker.invalid


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=300))
def test_batch_validation_only_refuses(blob, cut):
    candidate = (make_batch(2) + blob)[:cut] if cut else blob
    try:
        batch = records.validate(candidate, 1 << 20)
    except records.BatchError as error:
        assert error.code in ("corrupt_message", "invalid_record", "message_too_large")
    else:
        assert batch.record_count == 2


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120))
@example(text="\\n")  # a key that is a line break, by the properties escape: found in CI
def test_properties_parsing_and_validation_never_crash(text):
    raw = parse_properties(text)
    try:
        load_config(raw)
    except ConfigError as error:
        assert "\n" not in str(error)
