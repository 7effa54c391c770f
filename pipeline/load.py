"""Spark session and reading: event files in, one DataFrame of valid events out, bad lines counted.

A line Spark cannot parse against the schema (truncated, not JSON, a field of the wrong type,
no time or a time outside 2001-2100) is unreadable; a parsed line whose `v` is not SCHEMA_VERSION or whose `type` is unknown
is an unknown-version line.  Both are counted and dropped, never fatal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.schema import CORRUPT, SCHEMA_VERSION, TYPE_NAMES, event_schema

EARLIEST_MS, LATEST_MS = 978_307_200_000, 4_102_444_800_000  # 2001-01-01, 2100-01-01



GROUP_TYPES = ("group_rebalance", "share_deliveries")  # what the "groups" table reads

def spark_session(master: str | None = None, app: str = "pybroker-incidents") -> SparkSession:
    """Local Spark in this process unless a master URL (spark://, yarn, k8s://...) is given."""
    builder = (SparkSession.builder.appName(app)
               .master(master or "local[*]")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    if master is None:
        # Local mode stays on the loopback interface, whatever the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.ui.enabled", "false")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", "8")
                   .config("spark.driver.memory", "2g"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def event_paths(locations: list[str]) -> list[str]:
    """A local directory stands for its *.jsonl files; anything else goes to Spark as given."""
    paths = []
    for location in locations:
        if "://" not in location and os.path.isdir(location):
            paths.append(os.path.join(os.path.abspath(location), "*.jsonl"))
        else:
            paths.append(location)
    return paths


@dataclass(frozen=True)
class Loaded:
    events: DataFrame  # valid events, with `second` (epoch seconds) added
    lines: int
    bad_lines: int
    unknown_version: int
    group_events: int = 0  # group_rebalance and share_deliveries among them


def load_events(spark: SparkSession, locations: list[str], staging: str | None = None) -> Loaded:
    """Parse once.  With `staging`, the parsed lines are written there as Parquet and every
    aggregation reads the columns it needs from it (the fast path for big logs); without,
    they are cached in memory (small inputs, tests)."""
    raw = (spark.read.schema(event_schema())
           .option("mode", "PERMISSIVE")
           .option("columnNameOfCorruptRecord", CORRUPT)
           .json(event_paths(locations)))
    # Spark refuses queries on the corrupt column alone unless the parse is materialised.
    if staging is not None:
        raw.write.mode("overwrite").parquet(staging)
        raw = spark.read.parquet(staging)
    else:
        raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
    # A time outside 2001-2100 cannot be a broker's: such a line counts as unreadable
    # (and would otherwise stretch the timeline over decades).
    parsed = F.col(CORRUPT).isNull() & F.coalesce(
        F.col("ts").between(EARLIEST_MS, LATEST_MS), F.lit(False))
    # coalesce: a line without `v` or `type` is an unknown version, not a silent null.
    known = parsed & F.coalesce((F.col("v") == SCHEMA_VERSION) & F.col("type").isin(*TYPE_NAMES),
                                F.lit(False))
    counts = raw.select(
        F.count(F.lit(1)).alias("lines"),
        F.sum((~parsed).cast("long")).alias("bad"),
        F.sum((parsed & ~known).cast("long")).alias("unknown"),
        F.sum((known & F.col("type").isin(*GROUP_TYPES)).cast("long")).alias("groups"),
    ).first()
    events = raw.where(known).drop(CORRUPT).withColumn("second", F.floor(F.col("ts") / 1000))
    return Loaded(events=events, lines=counts["lines"] or 0, bad_lines=counts["bad"] or 0,
                  unknown_version=counts["unknown"] or 0, group_events=counts["groups"] or 0)
