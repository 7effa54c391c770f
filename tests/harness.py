"""Start `python -m broker` as a subprocess on ephemeral 127.0.0.1 ports, for tests and benches.

The broker logs one parseable line per bound address; this class reads its stderr on a thread
and exposes the listener and metrics addresses once `broker ready` is logged.  Only the process
started here is ever signalled, by its pid.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

# The checkout: the broker runs from it, and the tests find its tools under it.
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LISTENING = re.compile(r"listening listener=(\S+) address=(\S+):(\d+)")
_METRICS = re.compile(r"metrics listening address=(\S+):(\d+)")
_READY = re.compile(r"broker ready .* pid=(\d+)")
_SPAWNED = re.compile(r"spawned worker (\S+) pid=(\d+)")

# Under pytest (tests/conftest.py): whether the test being run carries the `system` marker.
# A test that starts a broker without it fails, so `pytest -m "not system"` never starts one.
system_marked = None  # None outside pytest (benches, soak, demo)


def check_system_marker() -> None:
    if system_marked is False:
        raise RuntimeError("this test starts a broker: mark it @pytest.mark.system")


class BrokerProcess:
    """One broker subprocess; use as a context manager."""

    def __init__(self, overrides: dict[str, str] | None = None, workers: int = 2,
                 data_dir: str | None = None, env: dict[str, str] | None = None,
                 log_level: str = "INFO", config_file: str | None = None,
                 open_files: int | None = None):
        """`open_files`: RLIMIT_NOFILE, soft and hard, of the broker and its workers."""
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pybroker-test-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        settings = {
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "num.network.threads": str(workers),
            "log.dirs": os.path.join(data_dir, "logs"),
            "prometheus.listen": "127.0.0.1:0",
        }
        settings.update(overrides or {})
        self.argv = [sys.executable, "-m", "broker", "--log-level", log_level]
        if config_file is not None:
            self.argv += ["--config", config_file]
        for key, value in settings.items():
            self.argv += ["--override", f"{key}={value}"]
        self.env = dict(os.environ, **(env or {}))
        self.open_files = open_files
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.listeners: dict[str, tuple[str, int]] = {}
        self.metrics_address: tuple[str, int] | None = None
        self.worker_pids: dict[str, int] = {}
        self._changed = threading.Condition()

    # --- life cycle -----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        check_system_marker()
        if self.proc is not None and self.proc.poll() is None:  # a second one would leak
            raise RuntimeError(f"broker pid {self.proc.pid} is already running")
        first_line = len(self.lines)  # a restart waits for its own "broker ready"
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=self.env, preexec_fn=self._limits)
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            self.wait_for_line(_READY, timeout, start=first_line)
        except BaseException:  # never ready: stopped here, for __exit__ will not run
            self.stop()
            if self._tmp is not None:
                self._tmp.cleanup()
            raise
        return self

    def _limits(self) -> None:
        """In the child, before exec: the open-files limit asked for (hard too, so the
        broker cannot raise it)."""
        if self.open_files is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then wait; SIGKILL only if it overstays `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL to the parent and every worker at once: no clean shutdown, the data dir
        kept for a restart on it."""
        for pid in [self.proc.pid, *self.worker_pids.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout)
        for pid in self.worker_pids.values():
            wait_until(lambda: not _alive(pid), timeout=timeout,
                       message=f"worker pid {pid} outlived SIGKILL")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return self.listeners["PLAINTEXT"][1]

    @property
    def bootstrap(self) -> str:
        host, port = self.listeners["PLAINTEXT"]
        return f"{host}:{port}"

    # --- output ---------------------------------------------------------------------------

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._parse(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _parse(self, line: str) -> None:
        if match := _LISTENING.search(line):
            self.listeners[match.group(1)] = (match.group(2), int(match.group(3)))
        elif match := _METRICS.search(line):
            self.metrics_address = (match.group(1), int(match.group(2)))
        elif match := _SPAWNED.search(line):
            self.worker_pids[match.group(1)] = int(match.group(2))

    def wait_for_line(self, pattern, timeout: float = 10.0, start: int = 0) -> re.Match:
        """Wait until a line (from index `start` on) matches; raise with the log if not."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[start:]:
                    if match := regex.search(line):
                        return match
                if self.proc.poll() is not None and not self._stderr_open():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, 0.2))
        raise AssertionError(f"no line matching {regex.pattern!r} within {timeout}s; log:\n"
                             + "\n".join(self.lines[-40:]))

    def _stderr_open(self) -> bool:
        return not self.proc.stderr.closed and self.proc.poll() is None

    # --- the event log ----------------------------------------------------------------------

    def events(self, kind) -> list:
        """Every event of type `kind` the broker's processes have written so far."""
        import glob

        from broker.shared.events import decode_line

        found = []
        for path in glob.glob(os.path.join(self.data_dir, "pybroker-events", "*.jsonl")):
            with open(path, "rb") as handle:
                found += [event for event in map(decode_line, handle) if isinstance(event, kind)]
        return found

    # --- metrics --------------------------------------------------------------------------

    def scrape(self) -> str:
        host, port = self.metrics_address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Value of one sample (0.0 if absent), e.g. metric("broker_connections", listener="X")."""
        wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        for line in self.scrape().splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            sample, _, label_text = series.partition("{")
            if sample != name:
                continue
            found = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
            if found == wanted:
                return float(value)
        return 0.0


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def memory(pid: int) -> dict[str, int]:
    """Resident bytes of a process (/proc/<pid>/status): VmRSS in all, RssAnon (its own heap),
    RssFile and RssShmem (mapped shared memory: the shared block); {} once it is gone."""
    found = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "RssAnon", "RssShmem", "RssFile"):
                    found[name] = int(value.split()[0]) * 1024
    except FileNotFoundError:
        pass
    return found


def rss(pid: int) -> int:
    return memory(pid).get("VmRSS", 0)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, message: str = ""):
    """Poll `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or f"condition not met within {timeout}s")
        time.sleep(interval)
