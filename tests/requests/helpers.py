"""Helpers of the request tests, shared with the fuzz targets: the parent's services that
answer forwarded requests, in process, and a router asked as a worker asks it."""

import asyncio

from broker.parent.admin import AdminService
from broker.parent.dynamic import DynamicConfig
from broker.parent.forwarded import ForwardedRouter
from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offsets import OffsetStore
from broker.parent.transactions.coordinator import TransactionCoordinator
from broker.shared.config import load_config
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry


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
        self.admin.group_configs.close()
        self.groups.close()
        self.transactions.close()
        self.registry.close()
        self.loop.close()

    def handle(self, frame: bytes):
        service = self.router.service_for(int.from_bytes(frame[:2], "big"))
        return service.handle(frame, 0, "127.0.0.1:1")


def ask_in_loop(loop: asyncio.AbstractEventLoop, router, frame: bytes):
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

