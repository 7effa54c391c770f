"""The runner: `python -m loadtest.bench [--passes N] [--seconds S] [--pipeline-gb G]` runs every
scenario once per pass (passes interleave), then the quota matrix, the connection figures and
the pipeline once (each takes minutes, or holds tens of thousands of connections), and prints
the table."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from loadtest.bench.accepts import raw_accept_close
from loadtest.bench.acls import authorization_costs, handler_costs
from loadtest.bench.common import write_frames
from loadtest.bench.connects import connection_figures, print_connects
from loadtest.bench.control import control_plane_latency
from loadtest.bench.events import event_log_off
from loadtest.bench.fairness import storm_fairness
from loadtest.bench.groups import group_figures
from loadtest.bench.log import produce_consume
from loadtest.bench.memory import memory_burst
from loadtest.bench.pipeline import pipeline_throughput
from loadtest.bench.protections import never_readers, refusal_costs
from loadtest.bench.quotas import print_quota_accuracy, quota_accuracy
from loadtest.bench.report import summarize
from loadtest.bench.requests import broker_rates, echo_rates
from loadtest.bench.security import security_costs
from loadtest.bench.sessions import fetch_session_costs
from loadtest.bench.transactions import transaction_figures


def one_pass(frames: dict[str, str], seconds: float) -> dict[str, dict]:
    figures = {}
    figures.update(echo_rates(frames, seconds))
    figures.update(event_log_off(frames, seconds))
    figures.update(broker_rates(frames, seconds))
    figures.update(produce_consume(seconds))
    figures.update(storm_fairness(frames["apiversions"], seconds))
    figures.update(control_plane_latency(seconds))
    figures.update(group_figures(seconds))
    figures["burst pool on"] = memory_burst(pool=True)
    figures["burst pool off"] = memory_burst(pool=False)
    figures.update(raw_accept_close(frames["apiversions"], seconds))
    figures.update(security_costs(seconds))
    figures.update(authorization_costs(seconds))
    figures.update(handler_costs())
    figures.update(fetch_session_costs())
    figures.update(never_readers())
    figures.update(refusal_costs(seconds))
    figures.update(transaction_figures(seconds))
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pipeline-gb", type=float, default=1.0,
                        help="size of the synthetic event log for the pipeline (0 skips it)")
    parser.add_argument("--save", help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pybroker-bench-") as tmp:
        frames = write_frames(tmp)
        passes = []
        for number in range(args.passes):
            started = time.monotonic()
            passes.append(one_pass(frames, args.seconds))
            print(f"pass {number + 1}/{args.passes} done in {time.monotonic() - started:.0f}s",
                  flush=True)
        quotas = quota_accuracy()
        connects = connection_figures()
        pipeline = pipeline_throughput(args.pipeline_gb, tmp) if args.pipeline_gb > 0 else None
    if args.save:
        with open(args.save, "w", encoding="utf-8") as handle:
            json.dump({"passes": passes, "quotas": quotas, "connects": connects,
                       "pipeline": pipeline}, handle, default=str)
    status = summarize(passes)
    if any(print_quota_accuracy(quotas)):
        status = 1
    if any(print_connects(connects)):
        status = 1
    if pipeline is not None:
        print(f"\n{'PySpark pipeline, local[*]':32} {'GB':>6} {'events':>12} {'seconds':>9} "
              f"{'events/s':>10} {'MB/s':>7}")
        print(f"{'synthetic event log':32} {pipeline['bytes'] / 1e9:>6.2f} "
              f"{pipeline['events']:>12,} {pipeline['seconds']:>9.1f} "
              f"{pipeline['events'] / pipeline['seconds']:>10,.0f} "
              f"{pipeline['bytes'] / 1e6 / pipeline['seconds']:>7.1f}")
        if not pipeline["ok"]:
            print("pipeline: the job failed or miscounted its input")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
