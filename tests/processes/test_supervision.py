"""Supervision: worker crashes, graceful shutdown, a killed parent, boot failures."""

import os
import signal
import struct
import subprocess
import threading
import time

import pytest

from tests.harness import PROJECT, BrokerProcess, wait_until
from tests.wire import KafkaSocket, api_versions_request

pytestmark = pytest.mark.system  # every test here starts a broker


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def shm_files(broker_pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"pybroker-{broker_pid}-")]


class Load:
    """Threads that keep ApiVersions round trips going on fresh connections; counts answers."""

    def __init__(self, address, threads=4):
        self.address, self.answered, self.failed = address, 0, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]
        self._lock = threading.Lock()

    def _run(self):
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                with KafkaSocket(self.address, timeout=5) as client:
                    for n in range(20):
                        client.send(api_versions_request(3, correlation_id=n))
                        assert struct.unpack_from(">i", client.receive())[0] == n
                with self._lock:
                    self.answered += 1
            except (OSError, AssertionError):
                with self._lock:
                    self.failed += 1

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def test_killed_worker_is_restarted_while_others_keep_serving():
    with BrokerProcess(workers=2) as broker:
        # A long-lived connection on each worker (round-robin puts them on different workers).
        keep = [KafkaSocket(broker.listeners["PLAINTEXT"]) for _ in range(2)]
        for client in keep:
            client.send(api_versions_request(3, correlation_id=1))
            client.receive()
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 2)
        victim = broker.worker_pids["data-0"]
        with Load(broker.listeners["PLAINTEXT"]) as load:
            wait_until(lambda: load.answered > 20)
            mark = len(broker.lines)
            os.kill(victim, signal.SIGKILL)
            broker.wait_for_line(rf"worker data-0 \(pid {victim}\) was killed by SIGKILL")
            wait_until(lambda: broker.worker_pids["data-0"] != victim)
            broker.wait_for_line(r"worker data-0 serving", start=mark)
            wait_until(lambda: broker.metric("broker_worker_up", worker="data-0") == 1)
            answered_after_restart = load.answered
            wait_until(lambda: load.answered > answered_after_restart + 20)
        # Exactly one of the long-lived connections died with the worker; the other serves.
        alive = []
        for client in keep:
            try:
                client.send(api_versions_request(3, correlation_id=2))
                alive.append(struct.unpack_from(">i", client.receive())[0] == 2)
            except OSError:
                alive.append(False)
            client.close()
        assert sorted(alive) == [False, True]
        assert broker.metric("broker_worker_restarts_total") == 1
        assert load.failed < load.answered / 10  # only connections caught on the dead worker
        # Every connection is accounted for: accepted = closed once all are gone.
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0,
                   message="connections of the dead worker were not released")
        lost = broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                             reason="worker_exit")
        assert lost >= 1
        assert not pid_alive(victim)


def test_sigterm_exits_cleanly_within_the_deadline():
    broker = BrokerProcess(workers=2, overrides={"pybroker.shutdown.timeout.ms": "3000"})
    with broker:
        pids = list(broker.worker_pids.values())
        shm = shm_files(broker.pid)
        assert len(shm) == 1
        idle = KafkaSocket(broker.listeners["PLAINTEXT"])
        started = time.monotonic()
        code = broker.stop(timeout=10)
        elapsed = time.monotonic() - started
        assert code == 0
        assert elapsed < 4
        assert idle.is_closed_by_peer()
        assert not any(pid_alive(pid) for pid in pids)
        assert shm_files(broker.pid) == []
        assert not os.path.exists(os.path.join(broker.data_dir, "logs", ".pybroker-runtime"))
        broker.wait_for_line("broker stopped")


def test_killed_parent_leaves_no_workers_and_the_next_start_cleans_up(tmp_path):
    first = BrokerProcess(workers=2, data_dir=str(tmp_path)).start()
    pids = list(first.worker_pids.values())
    stale = shm_files(first.pid)
    assert len(stale) == 1
    first.proc.kill()
    first.proc.wait()
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), timeout=10,
               message="workers outlived their parent")
    assert os.path.exists(f"/dev/shm/{stale[0]}")
    with BrokerProcess(workers=1, data_dir=str(tmp_path)) as second:
        second.wait_for_line("removing shared memory")
        assert not os.path.exists(f"/dev/shm/{stale[0]}")
        with KafkaSocket(second.listeners["PLAINTEXT"]) as client:
            client.send(api_versions_request(3, correlation_id=3))
            assert struct.unpack_from(">i", client.receive())[0] == 3


def test_second_broker_on_the_same_data_dir_is_refused(tmp_path):
    with BrokerProcess(workers=1, data_dir=str(tmp_path)):
        second = BrokerProcess(workers=1, data_dir=str(tmp_path))
        second.proc = subprocess.Popen(second.argv, stderr=subprocess.PIPE, text=True)
        _, err = second.proc.communicate(timeout=30)
        assert second.proc.returncode == 1
        assert "another broker is using" in err


def test_worker_that_cannot_boot_halts_the_broker(tmp_path):
    # A `workers` package earlier on the path that exits with the boot-error status, as a
    # worker does when it cannot start; the parent must stop instead of respawning forever.
    fake = tmp_path / "fake" / "workers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("import sys\nsys.exit(3)\n")
    project = PROJECT
    env = {"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{project}"}
    broker = BrokerProcess(workers=2, data_dir=str(tmp_path / "data"), env=env)
    broker.proc = subprocess.Popen(broker.argv, stderr=subprocess.PIPE, text=True, env=broker.env,
                                   cwd=str(tmp_path))
    _, err = broker.proc.communicate(timeout=60)
    assert broker.proc.returncode == 3
    assert "failed to boot; halting" in err
    assert err.count("spawned worker") == 2


def test_idle_connections_are_closed_after_connections_max_idle_ms():
    with BrokerProcess(workers=1, overrides={"connections.max.idle.ms": "300"}) as broker:
        with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=5) as idle:
            idle.send(api_versions_request(3, correlation_id=1))
            idle.receive()
            started = time.monotonic()
            assert idle.is_closed_by_peer()
            assert time.monotonic() - started < 3  # closed by the 1 s sweep, not by the timeout
        wait_until(lambda: broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                                         reason="idle") == 1)


def test_a_hung_worker_is_aborted_then_killed_and_replaced():
    overrides = {"pybroker.worker.heartbeat.timeout.ms": "1000"}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        hung = broker.worker_pids["data-0"]
        os.kill(hung, signal.SIGSTOP)  # its loop stops: no heartbeat, SIGABRT stays pending
        try:
            broker.wait_for_line(rf"worker data-0 \(pid {hung}\) heartbeat is .* aborting it")
            broker.wait_for_line(rf"worker data-0 \(pid {hung}\) was killed by SIGKILL", timeout=15)
        finally:
            if pid_alive(hung):
                os.kill(hung, signal.SIGKILL)
        wait_until(lambda: broker.worker_pids["data-0"] != hung)
        wait_until(lambda: broker.metric("broker_worker_up", worker="data-0") == 1)
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
            client.send(api_versions_request(3, correlation_id=4))
            assert struct.unpack_from(">i", client.receive())[0] == 4
