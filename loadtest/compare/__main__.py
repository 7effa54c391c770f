"""The runner: `python -m loadtest.compare [--only PART[,PART...]] [--seconds S] [--out PATH]`
runs the selected parts (all by default) group by group, each group starting this broker and
then Apache Kafka once where its parts allow, prints the table and writes the JSON.

Exit status 1 if our broker gave no figure for a scenario (a figure Kafka could not give is
reported with its reason, and is no failure of this run)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from loadtest.compare import connections, frontend, limits, requests, startup, throughput
from loadtest.compare.brokers import WORKER_NOTE
from loadtest.compare.table import render, save

GROUPS = (throughput, requests, connections, limits, startup, frontend)
PARTS = [part for group in GROUPS for part in group.PARTS]
NOTES = [WORKER_NOTE, "MB = 10^6 bytes; ratio = ours / Kafka's; 'better' says which way is "
         "better; both brokers on 127.0.0.1, started one at a time, with the same clients",
         "broker CPU: the broker's processes' utime + stime over the run, per MB moved, "
         "request or connection"]


def _group_name(group) -> str:
    return group.__name__.rsplit(".", 1)[-1]


def _selected(only: list[str] | None) -> list[str]:
    """The parts `--only` names, a group's name standing for all of its parts."""
    if not only:
        return PARTS
    groups = {_group_name(group): list(group.PARTS) for group in GROUPS}
    wanted = [name.strip() for item in only for name in item.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in PARTS and name not in groups]
    if unknown:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)}; the parts are: "
                         f"{', '.join(PARTS)} (or a group: {', '.join(groups)})")
    return [part for name in wanted for part in groups.get(name, [name])]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m loadtest.compare", description=__doc__)
    parser.add_argument("--only", action="append", metavar="PART",
                        help=f"run only these parts (repeat or comma-separate): {', '.join(PARTS)}"
                             "; a group's name (throughput, requests, connections, limits, "
                             "startup, frontend) runs all of its parts")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="length of each timed run (default 5)")
    parser.add_argument("--out", default=os.path.join("reports", "compare.json"))
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 300:
        parser.error("--seconds must be in (0, 300]")
    parts = _selected(args.only)
    started, load = time.time(), os.getloadavg()
    records = []
    for group in GROUPS:
        chosen = [part for part in group.PARTS if part in parts]
        if chosen:
            began = time.monotonic()
            records += group.run(chosen, args.seconds)
            print(f"{_group_name(group)}: {', '.join(chosen)} done in "
                  f"{time.monotonic() - began:.0f} s", flush=True)
    elapsed = time.time() - started
    print()
    print(render(records, NOTES))
    save(args.out, records, NOTES, started, elapsed, argv, load)
    print(f"\n{len(records)} scenarios in {elapsed:.0f} s; saved {args.out}")
    return 1 if any(record["ours"] is None for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
