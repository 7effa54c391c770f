"""Progress of the job on stderr, so a long run over a big event log is not silent.

The job names each step as it starts (`step`) and says what it measured (`say`: lines read,
events per second).  Meanwhile a thread polls Spark's SparkStatusTracker every `interval`
seconds and prints the running stages and their tasks when they changed: at most one line per
step and one per interval, so the output stays bounded however long the job runs.
"""

from __future__ import annotations

import sys
import threading
import time

from pipeline import words


class Progress:
    """Use as a context manager around the job; `step(name)` as each part starts."""

    def __init__(self, context, interval: float = 2.0, stream=None):
        self._tracker = context.statusTracker()
        self._interval = interval
        self._stream = stream  # None: whatever sys.stderr is when a line is written
        self._started = time.monotonic()
        self._step = "starting"
        self._step_started = self._started
        self._input_bytes = 0
        self._last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="pipeline-progress",
                                        daemon=True)
        self.lines = 0

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    def step(self, name: str, input_bytes: int = 0) -> None:
        """A new part of the job; with `input_bytes`, stage lines estimate the read rate."""
        self._step, self._step_started, self._input_bytes = name, time.monotonic(), input_bytes
        self.say(name)

    def say(self, text: str) -> None:
        stream = self._stream or sys.stderr
        print(f"pipeline {time.monotonic() - self._started:7.1f} s  {text}", file=stream,
              flush=True)
        self.lines += 1

    def rate(self, events: int) -> str:
        """"709 events in 1.5 s: 470 events/s" since the current step started."""
        seconds = max(time.monotonic() - self._step_started, 1e-3)
        return (f"{words.count(events)} events in {words.duration(seconds * 1000)}: "
                f"{words.count(events / seconds)} events/s")

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                line = self._stages()
            except Exception:  # noqa: BLE001 - a Spark that is stopping: no progress, no crash
                return
            if line and line[0] != self._last:  # stages or tasks moved: the rate alone is no news
                self._last = line[0]
                self.say(f"{self._step}: {line[0]}{line[1]}")

    def _stages(self) -> tuple[str, str] | None:
        """(running stages and their tasks, the read rate if known), or None when idle."""
        stages = [self._tracker.getStageInfo(stage)
                  for stage in sorted(self._tracker.getActiveStageIds())]
        stages = [stage for stage in stages if stage is not None]
        if not stages:
            return None
        done = sum(stage.numCompletedTasks for stage in stages)
        tasks = sum(stage.numTasks for stage in stages)
        ids = [stage.stageId for stage in stages]
        names = (f"stage {ids[0]}" if len(ids) == 1 else f"stages {ids[0]}, {ids[1]}" if
                 len(ids) == 2 else f"{len(ids)} stages ({ids[0]}{words.DASH}{ids[-1]})")
        line = f"Spark {names}: {done}/{tasks} tasks done"
        if not (self._input_bytes and done):
            return line, ""
        # File splits are about equal, so done/tasks of the input has been read.
        seconds = max(time.monotonic() - self._step_started, 1e-3)
        return line, f", about {words.size(self._input_bytes * done / tasks / seconds)}/s read"
