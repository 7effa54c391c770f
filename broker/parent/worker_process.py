"""The parent's record of one worker process (spawned and watched by broker.parent.supervisor)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.shared import ipc


@dataclass(eq=False)
class WorkerProcess:
    """The parent's view of one worker process: its slot, its pid and channel while it runs,
    and the hand-off counts the dispatcher and the connection ledger keep for it."""

    slot: int
    name: str
    control_plane: bool = False  # serves only the control-plane listener (KIP-291)
    pid: int = 0
    pidfd: int = -1
    channel: ipc.Channel | None = None
    ready: bool = False
    outstanding: int = 0  # sockets sent and not yet acknowledged as registered
    handed: list[int] = field(default_factory=list)  # sockets sent, per listener index
    conn_ids: set[int] = field(default_factory=set)  # sent and not yet reported closed
    started_at: float = 0.0
    abort_sent_at: float = 0.0

    def accepts(self, capacity: int) -> bool:
        return self.ready and self.channel is not None and self.outstanding < capacity

    @property
    def plane(self) -> str:
        return "control" if self.control_plane else "data"

    @property
    def serving(self) -> bool:
        return bool(self.pid and self.ready)
