"""The broker's footprint on the machine: data-directory lock, cluster id, shared-memory file.

The first of `log.dirs` holds, as Kafka's does, a `.lock` file (flock'ed for the broker's
life, so two brokers never share a directory) and `meta.properties` (cluster.id and node.id,
created on first start).  It also holds `.pybroker-runtime`, naming the shared-memory file of
the running broker: if a previous parent was killed with SIGKILL, the next start finds that
name and deletes the stale file before creating its own.

It also raises the process's open-files limit to its hard limit (the workers inherit it):
every connection is a descriptor, and a default soft limit of 1,024 would cap the broker far
below what the machine holds.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import resource
import uuid

from broker.shared.config import BrokerConfig, ConfigError, parse_properties

log = logging.getLogger("broker.parent.runtime")

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
SHM_PREFIX = "pybroker-"
RUNTIME_FILE = ".pybroker-runtime"


def raise_open_files_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one; log and return what it got."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as error:
            log.warning("open files limit stays %d: raising it to %d failed: %s", soft,
                        wanted, error)
            return soft
    log.info("open files limit %d (was %d, hard limit %s)", max(soft, wanted), soft,
             "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return max(soft, wanted)


class StartupError(RuntimeError):
    """The broker cannot start (exit status 1), e.g. its data directory is in use."""


class Runtime:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.data_dir = config.log_dirs[0]
        self.shm_path = os.path.join(SHM_DIR, f"{SHM_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.cluster_id = ""
        self._lock_fd = -1

    def acquire(self) -> None:
        for directory in self.config.log_dirs:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as error:
                raise StartupError(f"log.dirs: cannot create {directory}: {error.strerror}") from None
        raise_open_files_limit()
        self._lock()
        self.cluster_id = self._meta_properties()
        self._remove_stale_shm()
        self._write_runtime_file()

    def release(self) -> None:
        for path in (self.shm_path, os.path.join(self.data_dir, RUNTIME_FILE)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = -1

    # --- steps ----------------------------------------------------------------------------

    def _lock(self) -> None:
        path = os.path.join(self.data_dir, ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(f"failed to acquire lock on {path}: another broker is using "
                               f"{self.data_dir}") from None
        self._lock_fd = fd

    def _meta_properties(self) -> str:
        path = os.path.join(self.data_dir, "meta.properties")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                meta = parse_properties(handle.read())
            stored = meta.get("node.id")
            if stored is not None and int(stored) != self.config.node_id:
                raise ConfigError(f"node.id: {self.config.node_id} does not match node.id "
                                  f"{stored} stored in {path}")
            if meta.get("cluster.id"):
                return meta["cluster.id"]
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(f"version=1\ncluster.id={cluster_id}\nnode.id={self.config.node_id}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        return cluster_id

    def _remove_stale_shm(self) -> None:
        path = os.path.join(self.data_dir, RUNTIME_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                stale = handle.read().strip()
        except FileNotFoundError:
            return
        # We hold the directory lock, so the broker that wrote this name is gone.
        if stale.startswith(os.path.join(SHM_DIR, SHM_PREFIX)) and os.path.exists(stale):
            log.warning("removing shared memory %s left by a broker that did not exit cleanly",
                        stale)
            os.unlink(stale)

    def _write_runtime_file(self) -> None:
        path = os.path.join(self.data_dir, RUNTIME_FILE)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self.shm_path + "\n")
