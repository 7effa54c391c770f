"""Helpers of the group tests: the group coordinator in process, requests in and answers out
on a private event loop (shared with the ACL tests, which ask it for authorized operations)."""

import asyncio
import datetime

from kio.schema.errors import ErrorCode

from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offsets import OffsetStore
from broker.shared.clock import now_ms
from broker.shared.config import load_config
from tests.wire import decode_response, request


class StoppedClock:
    """The coordinator's wall clock: the real one until a test stops it at `ms`."""

    def __init__(self):
        self.ms: int | None = None

    def __call__(self) -> int:
        return now_ms() if self.ms is None else self.ms


class GroupHarness:
    """A GroupCoordinator of its own over `tmp_path`, the requests a consumer sends, and the
    loop that brings waiting answers."""

    def __init__(self, tmp_path, **settings):
        raw = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "100",
               "log.dirs": str(tmp_path)}
        raw.update({key.replace("_", "."): value for key, value in settings.items()})
        self.props = load_config(raw).props
        self.loop = asyncio.new_event_loop()
        self.directory = str(tmp_path)
        self.clock = StoppedClock()
        self.coordinator = self._coordinator()

    def _coordinator(self):
        return GroupCoordinator(self.loop, self.props, OffsetStore(self.directory),
                                {"t": 2}.get, clock=self.clock)

    def restart(self):
        self.coordinator.close()
        self.coordinator = self._coordinator()
        self.coordinator.start()  # the broker serves: restored sessions start

    def send(self, api_key: int, version: int, values: dict, client_id: str = "test"):
        """The decoded answer, or a Future of it."""
        answer = self.coordinator.handle(request(api_key, version, values, client_id), 0,
                                         "10.1.2.3:4567")
        if isinstance(answer, asyncio.Future):
            decoded = self.loop.create_future()
            answer.add_done_callback(lambda done: decoded.set_result(
                decode_response(api_key, version, done.result()[4:])[1]))
            return decoded
        return decode_response(api_key, version, answer[4:])[1]

    def wait(self, future, timeout: float = 5.0):
        """The answer a Future brings (an answer given at once passes through)."""
        if not isinstance(future, asyncio.Future):
            return future
        return self.loop.run_until_complete(asyncio.wait_for(asyncio.shield(future), timeout))

    def settle(self, seconds: float):
        self.loop.run_until_complete(asyncio.sleep(seconds))

    # --- the requests, as a consumer sends them -------------------------------------------

    def join(self, member_id="", session=10.0, rebalance=5.0, protocols=(("range", b"m"),),
             instance=None, client_id="test"):
        return self.send(11, 5, {
            "group_id": "g", "session_timeout": datetime.timedelta(seconds=session),
            "rebalance_timeout": datetime.timedelta(seconds=rebalance), "member_id": member_id,
            "group_instance_id": instance, "protocol_type": "consumer",
            "protocols": [{"name": name, "metadata": data} for name, data in protocols]},
            client_id)

    def join_member(self, **options):
        """MEMBER_ID_REQUIRED, then the real join: (member id, Future of the join answer)."""
        first = self.join(**options)
        assert first.error_code == ErrorCode.member_id_required and first.member_id
        return first.member_id, self.join(member_id=first.member_id, **options)

    def sync(self, member_id, generation, assignments=()):
        return self.send(14, 3, {"group_id": "g", "generation_id": generation,
                                 "member_id": member_id, "group_instance_id": None,
                                 "assignments": [{"member_id": m, "assignment": a}
                                                 for m, a in assignments]})

    def heartbeat(self, member_id, generation):
        return self.send(12, 3, {"group_id": "g", "generation_id": generation,
                                 "member_id": member_id, "group_instance_id": None}).error_code

    def commit(self, offsets, generation=-1, member_id="", metadata=None):
        return self.send(8, 8, {
            "group_id": "g", "generation_id_or_member_epoch": generation, "member_id": member_id,
            "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "committed_offset": offset,
                 "committed_leader_epoch": -1, "committed_metadata": metadata}]}
                for (topic, partition), offset in offsets.items()]})

    def committed(self, group="g"):
        answer = self.send(9, 8, {"groups": [{"group_id": group, "topics": None}],
                                  "require_stable": False})
        return {(t.name, p.partition_index): p.committed_offset
                for t in answer.groups[0].topics for p in t.partitions}

    def close(self):
        self.coordinator.close()
        self.loop.close()


class Events:
    """The event log, as the coordinator writes to it."""

    def __init__(self):
        self.emitted = []

    def emit(self, event) -> None:
        self.emitted.append(event)
