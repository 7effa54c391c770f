"""pipeline: once per run, the PySpark pipeline over a synthetic event log of --pipeline-gb GB
(loadtest/events_gen.py): events per second, JVM start-up included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def pipeline_throughput(gigabytes: float, tmp: str) -> dict:
    """Generate an event log of `gigabytes`, run `python -m pipeline` on it, time it."""
    from loadtest.events_gen import generate

    directory = os.path.join(tmp, "events")
    lines, size = generate(directory, int(gigabytes * 1e9))
    out = os.path.join(tmp, "pipeline-out")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeline", "--events", directory, "--out", out],
                          capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - started
    ok = done.returncode == 0
    if ok:
        with open(os.path.join(out, "summary.json")) as handle:
            ok = json.load(handle)["events"] == lines
    else:
        print(done.stderr[-2000:])
    return {"events": lines, "bytes": size, "seconds": took, "ok": ok}
