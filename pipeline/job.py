"""The whole job: read event logs, compute the tables, write Parquet, the report and a summary.

`python -m pipeline --events DIR [--events DIR ...] --out DIR [--master URL]`

Without --master Spark runs in local mode inside this process; with one (spark://host:7077,
yarn, k8s://...) the same DataFrame job runs on that cluster unchanged: the event paths must
then be readable by the executors (a shared file system, hdfs://, s3a://), and --out is where
the Parquet tables go (the HTML report and summary are written by the driver, locally).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

from pyspark.sql import functions as F

from pipeline import aggregate
from pipeline.load import load_events, spark_session
from pipeline.report import terminal_summary, write_html


def run(locations: list[str], out: str, master: str | None = None, top: int = 10,
        window: int = 10, limits: aggregate.Thresholds = aggregate.Thresholds(),
        spark=None) -> dict:
    """Run the job; return the summary (also written to out/summary.json)."""
    started = time.monotonic()
    spark = spark or spark_session(master)
    os.makedirs(out, exist_ok=True)
    loaded = load_events(spark, locations, staging=os.path.join(out, "parsed_events"))
    events = loaded.events
    per_second = aggregate.timeline(events).cache()
    tables = {
        "timeline": per_second,
        "top_n": aggregate.top_n(events, top),
        "incidents": aggregate.incidents(events, per_second, limits),
        "fairness": aggregate.fairness(events, window),
        "denied": aggregate.denied(events),
        "latency_by_plane": aggregate.latency_percentiles(events, ["plane"]),
    }
    os.makedirs(out, exist_ok=True)
    for name, table in tables.items():
        table.write.mode("overwrite").parquet(os.path.join(out, name))
    rows = {name: table.collect() for name, table in tables.items()}
    summary = _summary(loaded, events, rows, limits, window)
    summary["job_seconds"] = round(time.monotonic() - started, 2)
    report = os.path.join(out, "report.html")
    write_html(report, summary, rows["timeline"], rows["incidents"], rows["top_n"],
               rows["fairness"], rows["denied"])
    summary["report"] = report
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, default=str)
    print(terminal_summary(summary, rows["incidents"], rows["top_n"]))
    print(f"report: {report}")
    return summary


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
