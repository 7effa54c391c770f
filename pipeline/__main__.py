"""`python -m pipeline --events DIR --out DIR [--master URL] [--baseline DIR]`: the command
line of pipeline/job.py."""

from __future__ import annotations

import argparse
import shutil
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline",
                                     description="Turn broker event logs into an incident report.")
    parser.add_argument("--events", action="append", required=True,
                        help="an event log directory or any path/glob Spark reads (repeatable)")
    parser.add_argument("--out", required=True, help="where the Parquet tables and report go")
    parser.add_argument("--master", help="Spark master URL; default: local mode in-process")
    parser.add_argument("--baseline", help="an earlier run's --out directory: the report "
                        "compares this run with it, side by side")
    parser.add_argument("--top", type=int, default=10, help="rows per top-N table")
    parser.add_argument("--window", type=int, default=10, help="fairness window, seconds")
    parser.add_argument("--rejected-per-second", type=int, default=10)
    parser.add_argument("--blocked-ratio", type=float, default=0.5)
    parser.add_argument("--depleted-ms", type=float, default=500.0)
    parser.add_argument("--throttled-ms", type=float, default=500.0,
                        help="throttle delay handed out in one second that makes an incident")
    parser.add_argument("--control-requests-per-second", type=int, default=100)
    parser.add_argument("--progress-seconds", type=float, default=2.0,
                        help="how often progress is printed on stderr, at most")
    args = parser.parse_args(argv)
    if shutil.which("java") is None:
        print("pipeline: Spark needs Java; install it with "
              "`apt-get install default-jre-headless`", file=sys.stderr)
        return 2
    from pipeline.aggregate import Thresholds
    from pipeline.compare import BaselineError
    from pipeline.job import run

    limits = Thresholds(args.rejected_per_second, args.blocked_ratio, args.depleted_ms,
                        args.throttled_ms, args.control_requests_per_second)
    try:
        run(args.events, args.out, args.master, args.top, args.window, limits,
            baseline=args.baseline, progress_interval=args.progress_seconds)
    except BaselineError as error:
        print(f"pipeline: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
