"""Entry point of a worker process: `python -m workers --channel FD`.

The parent spawns this with one end of a socket pair as FD.  Boot: read the Boot message,
attach the shared block, then run the Worker on a fresh uvloop.  Exit status 3 means the
worker failed before it could serve (the parent then refuses to crash-loop).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys

from broker.shared.constants import LOG_FORMAT, WORKER_BOOT_ERROR
from broker.shared.gc_tuning import tune_after_start
from broker.shared.lean_imports import without_test_strategies

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux for SIGTERM when the parent dies; the hand-off EOF is the portable backstop."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        sys.exit(0)  # the parent died before prctl took effect


def _boot(channel_fd: int):
    from broker.shared import ipc
    from shm.block import STATE_BOOTING, SharedBlock
    from workers.worker import Worker

    channel = ipc.Channel(socket.socket(fileno=channel_fd))  # blocking until the loop runs
    channel.sock.setblocking(True)
    message, fds = channel.receive()
    for fd in fds:
        os.close(fd)
    if not isinstance(message, ipc.Boot):
        raise RuntimeError(f"expected Boot, got {type(message).__name__}")
    block = SharedBlock.attach(message.shm_path)
    block.set_state(message.slot, STATE_BOOTING)
    return Worker(message, channel, block)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers")
    parser.add_argument("--channel", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    _die_with_parent(args.parent)
    try:
        import uvloop
        worker = _boot(args.channel)
    except Exception:  # anything at boot is fatal: report it and tell the parent not to retry
        logging.getLogger("workers").exception("worker failed to boot")
        return WORKER_BOOT_ERROR
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches all
    tune_after_start()
    runner = uvloop.new_event_loop()
    runner.add_signal_handler(signal.SIGTERM, worker.begin_shutdown, worker.shutdown_seconds)
    try:
        runner.run_until_complete(worker.serve())
    finally:
        runner.close()
        worker.block.close()
    return 0


if __name__ == "__main__":
    without_test_strategies()
    sys.exit(main())
