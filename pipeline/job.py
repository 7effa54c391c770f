"""The whole job: read event logs, compute the tables, write Parquet, the report and a summary.

`python -m pipeline --events DIR [--events DIR ...] --out DIR [--master URL] [--baseline DIR]`

Without --master Spark runs in local mode inside this process; with one (spark://host:7077,
yarn, k8s://...) the same DataFrame job runs on that cluster unchanged: the event paths must
then be readable by the executors (a shared file system, hdfs://, s3a://), and --out is where
the Parquet tables go (the HTML report and summary are written by the driver, locally).
Each table is computed once: written, then read back from its Parquet for the report.
Progress goes to stderr (pipeline.progress), the summary to stdout.
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import asdict

from pyspark.sql import functions as F

from pipeline import aggregate, compare
from pipeline.load import load_events, spark_session
from pipeline.progress import Progress
from pipeline.report import Report, terminal_summary, write_html

# How each table's rows are ordered for the report (Parquet read back keeps no order).
ORDER = {
    "timeline": lambda row: row["second"],
    "top_n": lambda row: (row["dimension"], row["metric"], row["rank"]),
    "incidents": lambda row: row["start"],
    "impact": lambda row: (row["incident"], row["client_id"]),
    "fairness": lambda row: row["window_start"],
    "denied": lambda row: (-row["denials"], row["principal"], row["api"], row["resource"]),
    "groups": lambda row: row["rank"],
    "latency_by_plane": lambda row: row["plane"],
}


def run(locations: list[str], out: str, master: str | None = None, top: int = 10,
        window: int = 10, limits: aggregate.Thresholds = aggregate.Thresholds(),
        spark=None, baseline: str | None = None, progress_interval: float = 2.0) -> dict:
    """Run the job; return the summary (also written to out/summary.json)."""
    started = time.monotonic()
    spark = spark or spark_session(master)
    os.makedirs(out, exist_ok=True)
    with Progress(spark.sparkContext, progress_interval) as progress:
        earlier = None
        if baseline is not None:  # first: a wrong directory fails before the long part
            progress.step(f"reading the baseline {baseline}")
            earlier = compare.load_run(spark, baseline)
        progress.step("reading event files", input_bytes=_local_bytes(locations))
        loaded = load_events(spark, locations, staging=os.path.join(out, "parsed_events"))
        progress.say(f"read {_lines_read(loaded)}: {progress.rate(loaded.lines)}")
        rows = _tables(spark, loaded.events, out, top, window, limits, progress,
                       loaded.group_events)
        summary = _summary(loaded, loaded.events, rows, limits, window)
        progress.step("writing the report")
        summary["job_seconds"] = round(time.monotonic() - started, 2)
        report = Report(summary, rows, asdict(limits), window, earlier)
        summary["what_happened"] = [story.as_dict() for story in report.stories]
        path = os.path.join(out, "report.html")
        write_html(path, report)
        summary["report"] = path
        if baseline is not None:
            summary["baseline"] = baseline
        with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2, default=str)
        progress.say(f"done: {summary['events']:,} events in {summary['job_seconds']:.1f} s "
                     "with Spark's start, "
                     f"{summary['events'] / max(summary['job_seconds'], 1e-3):,.0f} events/s")
    print(terminal_summary(report))
    print(f"report: {path}")
    return summary


def _lines_read(loaded) -> str:
    return (f"{loaded.lines:,} lines, {loaded.bad_lines:,} unreadable, "
            f"{loaded.unknown_version:,} of an unknown version")


def _tables(spark, events, out: str, top: int, window: int, limits, progress,
            group_events: int = 1) -> dict:
    """Compute, write and read back each table; return its rows as dicts, in order.  A log
    without group events gets an empty "groups" table without its aggregation's shuffles."""
    per_second = aggregate.timeline(events)
    # Built in this order, each from the tables already written (`done`) where it can be.
    tables = {
        "timeline": lambda done: per_second,
        "incidents": lambda done: aggregate.incidents(events, done["timeline"], limits),
        "impact": lambda done: aggregate.impact(events, done["incidents"]),
        "top_n": lambda done: aggregate.top_n(events, top),
        "fairness": lambda done: aggregate.fairness(events, window),
        "denied": lambda done: aggregate.denied(events),
        "groups": lambda done: aggregate.groups(events, top) if group_events else
        spark.createDataFrame([], aggregate.groups(events, top).schema),
        "latency_by_plane": lambda done: aggregate.latency_percentiles(events, ["plane"]),
    }
    done, rows = {}, {}
    for name, build in tables.items():
        progress.step(f"computing {name}")
        path = os.path.join(out, name)
        build(done).write.mode("overwrite").parquet(path)
        done[name] = spark.read.parquet(path)
        rows[name] = sorted((row.asDict(recursive=True) for row in done[name].collect()),
                            key=ORDER[name])
    return rows


def _local_bytes(locations: list[str]) -> int:
    """The size of the event files in local directories (0 when Spark reads elsewhere)."""
    return sum(os.path.getsize(path) for location in locations
               if "://" not in location and os.path.isdir(location)
               for path in glob.glob(os.path.join(location, "*.jsonl")))


def _summary(loaded, events, rows: dict, limits, window: int) -> dict:
    summary = {"lines": loaded.lines, "events": loaded.lines - loaded.bad_lines -
               loaded.unknown_version, "bad_lines": loaded.bad_lines,
               "unknown_version": loaded.unknown_version, "seconds": len(rows["timeline"]),
               "incidents": len(rows["incidents"]), "fairness_window_s": window,
               **{f"threshold_{key}": value for key, value in asdict(limits).items()}}
    nodes = events.agg(F.countDistinct("node").alias("n")).first()["n"]
    summary["brokers"] = nodes
    for row in rows["latency_by_plane"]:
        summary[f"{row['plane']}_requests"] = row["requests"]
        summary[f"{row['plane']}_p50_ms"] = row["p50_ms"]
        summary[f"{row['plane']}_p99_ms"] = row["p99_ms"]
    return summary
