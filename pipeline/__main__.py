"""`python -m pipeline --events DIR --out DIR [--master URL]`: see pipeline/job.py."""

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
    parser.add_argument("--top", type=int, default=10, help="rows per top-N table")
    parser.add_argument("--window", type=int, default=10, help="fairness window, seconds")
    parser.add_argument("--rejected-per-second", type=int, default=10)
    parser.add_argument("--blocked-ratio", type=float, default=0.5)
    parser.add_argument("--depleted-ms", type=float, default=500.0)
    args = parser.parse_args(argv)
    if shutil.which("java") is None:
        print("pipeline: Spark needs Java; install it with "
              "`apt-get install default-jre-headless`", file=sys.stderr)
        return 2
    from pipeline.aggregate import Thresholds
    from pipeline.job import run

    run(args.events, args.out, args.master, args.top, args.window,
        Thresholds(args.rejected_per_second, args.blocked_ratio, args.depleted_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
