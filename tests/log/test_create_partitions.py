"""CreatePartitions through a worker's real router: many partitions are built a slice per
event-loop turn (the request never holds the loop), then committed at once."""

import asyncio
import datetime

from kio.schema.errors import ErrorCode

from tests.helpers import make_router
from tests.wire import request
from tests.wire import decode_response


def test_many_new_partitions_are_built_a_slice_per_loop_turn(tmp_path):
    router = make_router(str(tmp_path / "logs"))
    registry = router.apis[37].services.registry
    registry.create("wide", 1)
    frame = request(37, 3, {"topics": [{"name": "wide", "count": 200, "assignments": None}],
                            "timeout": datetime.timedelta(seconds=30), "validate_only": False})
    loop = asyncio.new_event_loop()
    turns = [0]

    async def ask():
        answer = router.handle(frame, 0)
        assert isinstance(answer, asyncio.Future)  # not built in this turn
        while not answer.done():
            turns[0] += 1
            await asyncio.sleep(0)
        return answer.result()

    try:
        answer = loop.run_until_complete(ask())
    finally:
        loop.close()
    [result] = decode_response(37, 3, answer[4:])[1].results
    assert result.error_code == ErrorCode.none and registry.get("wide").partitions == 200
    assert turns[0] >= 199 // 32  # SLICE_PARTITIONS per turn, other work in between
    small = request(37, 3, {"topics": [{"name": "wide", "count": 201, "assignments": None},
                                       {"name": "missing", "count": 2, "assignments": None}],
                            "timeout": datetime.timedelta(seconds=30), "validate_only": False})
    grown, missing = decode_response(37, 3, router.handle(small, 0)[4:])[1].results
    assert grown.error_code == ErrorCode.none and registry.get("wide").partitions == 201
    assert missing.error_code == ErrorCode.unknown_topic_or_partition
