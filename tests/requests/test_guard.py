"""The request guard (broker.shared.protocol.guard) against kio's own reader, on every request
schema.

kio aborts the process on an array count its frame cannot back, so hostile counts are tried in
a child process: an abort there fails the test instead of killing pytest.
"""

import io
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records

from broker.shared.protocol.guard import GuardError, walker
from tests.harness import PROJECT

st.register_type_strategy(Records, st.binary(max_size=40).map(Records))


def request_classes():
    found = []
    for key, name in sorted(api_key_map.items()):
        for version in sorted(schema_name_map[name]):
            try:
                found.append(load_request_schema(key, version))
            except Exception:  # kio's index lists versions it has no request for
                continue
    return found


CLASSES = request_classes()


def encode(entity) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def test_every_request_schema_compiles():
    assert len(CLASSES) > 250
    for cls in CLASSES:
        walker(cls)
        walker(cls, to_end=True)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__module__.split(".", 2)[2])
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_walk_ends_where_kio_ends_and_passes_every_sound_request(cls, data):
    entity = data.draw(st.from_type(cls))
    frame = encode(entity)
    try:
        _, used = entity_reader(cls)(frame, 0)
    except Exception:  # kio's writer accepts values its reader refuses (huge timedeltas)
        return
    assert walker(cls, to_end=True)(frame, 0) == used == len(frame)
    walker(cls)(frame, 0)  # a sound request is never refused


def test_the_reported_frame_is_refused_before_kio_sees_it():
    # DescribeGroups v5 from the review: a compact array claiming 2**32 - 2 groups in 3 bytes.
    frame = bytes.fromhex("000f00050000000200017800ffffffff0f000000")
    with pytest.raises(GuardError, match="4294967294 elements"):
        walker(load_request_schema(15, 5))(frame, 12)


HOSTILE_COUNTS = ("ffffffff0f", "feffffff0f", "7fffffff", "40000000")

_PROBE = r"""
import io, sys
from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map
from broker.shared.protocol.codec import request_readers
patterns = [bytes.fromhex(p) for p in sys.argv[1:]]
checked = 0
for key, name in sorted(api_key_map.items()):
    for version in sorted(schema_name_map[name]):
        try:
            header_reader, body_reader = request_readers(key, version)
        except KeyError:
            continue
        # A minimal body: every field absent, so counts land where fields begin.
        for length in range(0, 48):
            for pattern in patterns:
                for fill in (b"\0", b"\1"):
                    body = (fill * length + pattern + fill * 8)
                    print(key, version, length, pattern.hex(), flush=True, file=sys.stderr)
                    try:
                        body_reader(body, 0)
                    except Exception:
                        pass
                    checked += 1
print(checked)
"""


def test_a_hostile_count_anywhere_in_any_request_never_aborts(tmp_path):
    """Every request schema, a huge count written at each of the first 48 bytes of the body:
    the guarded reader raises; the process survives (an abort would end it with SIGABRT)."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *HOSTILE_COUNTS], capture_output=True,
                          text=True, timeout=300, cwd=PROJECT)
    last = done.stderr.strip().splitlines()[-1:] if done.stderr else []
    assert done.returncode == 0, f"the decoder died on {last}: {done.stderr[-2000:]}"
    assert int(done.stdout) > 100_000
