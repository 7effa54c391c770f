"""The incident tables, each a function from the events DataFrame (pipeline.load) to a table.

timeline    one row per second from the first event to the last: connections accepted and
            rejected (by reason), active connections, the worst acceptor's blocked ratio, pool
            used and depleted time, distinct throttled clients, and per plane the request rate
            with p50/p99 latency from the merged sketches
top_n       the N biggest IPs, client ids, users and principals by connections, rejections,
            bytes, throttle time and failed authentications; and by what limits in shadow
            mode would have done (shadow_rejections, shadow_throttle_ms)

Shadow mode (issue 19): events with `dry_run` set are what a limit observing only would have
done.  They are kept out of every enforced count (rejections, throttles, incidents) and
counted apart: `shadow_rejected` and `shadow_throttle_ms` per second in the timeline.
incidents   runs of seconds where rejections, acceptor blocking or pool depletion pass their
            thresholds (quiet gaps up to `gap` seconds joined), with start, end, peaks, the
            IP and client id that drove them, and the requests the ACLs denied meanwhile
            (how many, and the principal and resource denied most)
denied      the requests the ACLs denied: per principal, API, resource and operation, how
            many, from how many addresses, first and last second
fairness    per window of `window` seconds, Jain's index over the clients' served requests:
            (sum x)^2 / (n * sum x^2), 1 when all got the same, 1/n when one got everything
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

REJECT_REASONS = ("per_ip_limit", "per_ip_rate", "evicted")
OTHER = "<other>"  # workers.events: clients past a worker's key limit, not one client
MAX_FILLED_SECONDS = 7 * 86400
PLANES = ("data", "control")


@dataclass(frozen=True)
class Thresholds:
    rejected_per_second: int = 10
    blocked_ratio: float = 0.5
    depleted_ms: float = 500.0
    gap_seconds: int = 1


def _of(events: DataFrame, kind: str, dry_run: bool = False) -> DataFrame:
    """Events of one type; of those that carry `dry_run` (rejections, throttles), the
    enforced ones, or with `dry_run` the shadow mode's."""
    frame = events.where(F.col("type") == kind)
    if kind in ("connection_rejected", "throttle"):
        frame = frame.where(F.coalesce(F.col("dry_run"), F.lit(False)) == F.lit(dry_run))
    return frame


def bucket_upper_ms(bucket):
    """A sketch bucket's upper bound in ms (broker.shared.events.bucket_upper, as a column)."""
    return F.when(bucket < 8, bucket + 1).otherwise(
        F.pow(F.lit(2.0), F.floor(bucket / 4)) * (5 + bucket % 4) / 4) / 1000.0


def latency_percentiles(events: DataFrame, keys: list[str],
                        quantiles=(("p50_ms", 0.5), ("p99_ms", 0.99))) -> DataFrame:
    """Per `keys`: requests, and each quantile as the upper bound of the bucket reaching it."""
    buckets = (_of(events, "requests")
               .select(*keys, F.explode("latency").alias("bucket", "n"))
               .withColumn("bucket", F.col("bucket").cast("int"))
               .groupBy(*keys, "bucket").agg(F.sum("n").alias("n")))
    ordered = Window.partitionBy(*keys).orderBy("bucket").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    ranked = (buckets.withColumn("cumulative", F.sum("n").over(ordered))
              .withColumn("total", F.sum("n").over(Window.partitionBy(*keys))))
    columns = [F.first("total").alias("requests")]
    for name, quantile in quantiles:
        reached = F.when(F.col("cumulative") >= F.col("total") * quantile, F.col("bucket"))
        columns.append(F.min(reached).alias(f"_{name}"))
    found = ranked.groupBy(*keys).agg(*columns)
    for name, _ in quantiles:
        found = found.withColumn(name, bucket_upper_ms(F.col(f"_{name}"))).drop(f"_{name}")
    return found


def timeline(events: DataFrame) -> DataFrame:
    span = events.agg(F.min("second").alias("lo"), F.max("second").alias("hi")).first()
    spark = events.sparkSession
    if span["lo"] is None:
        return spark.createDataFrame([], "second long")
    if span["hi"] - span["lo"] <= MAX_FILLED_SECONDS:  # every second, quiet ones as zeros
        seconds = spark.range(span["lo"], span["hi"] + 1).withColumnRenamed("id", "second")
    else:  # logs far apart in time: only the seconds that have events
        seconds = events.select("second").distinct()
    accepted = _of(events, "connection_accepted").groupBy("second").agg(
        F.count(F.lit(1)).alias("accepted"))
    rejected = (_of(events, "connection_rejected").groupBy("second")
                .pivot("reason", list(REJECT_REASONS)).agg(F.count(F.lit(1))))
    for reason in REJECT_REASONS:
        rejected = rejected.withColumnRenamed(reason, f"rejected_{reason}")
    # Per broker (node) first, then summed: several brokers' logs make one cluster's view.
    stats = (_of(events, "broker_stats").groupBy("second", "node").agg(
        F.max(F.aggregate(F.map_values("active"), F.lit(0).cast("long"),
                          lambda total, x: total + x)).alias("active"),
        F.max("pool_used").alias("pool_used"),
        F.sum("depleted_ms").alias("pool_depleted_ms"))
        .groupBy("second").agg(F.sum("active").alias("active"),
                               F.sum("pool_used").alias("pool_used"),
                               F.max("pool_depleted_ms").alias("pool_depleted_ms")))
    blocked = (_of(events, "acceptor_blocked").groupBy("second", "listener")
               .agg((F.sum("blocked_ms") / 1000).alias("ratio"))
               .groupBy("second").agg(F.least(F.max("ratio"), F.lit(1.0))
                                      .alias("acceptor_blocked_ratio")))
    throttled = _of(events, "throttle").groupBy("second").agg(
        F.countDistinct("client_id").alias("throttled_clients"),
        F.sum("throttle_ms").alias("throttle_ms"))
    shadow = (_of(events, "connection_rejected", dry_run=True).groupBy("second")
              .agg(F.count(F.lit(1)).alias("shadow_rejected"))
              .join(_of(events, "throttle", dry_run=True).groupBy("second")
                    .agg(F.sum("throttle_ms").alias("shadow_throttle_ms")), "second", "full"))
    latency = latency_percentiles(events, ["second", "plane"])
    per_plane = latency.groupBy("second").pivot("plane", list(PLANES)).agg(
        F.first("requests").alias("requests"), F.first("p50_ms").alias("p50_ms"),
        F.first("p99_ms").alias("p99_ms"))
    table = seconds
    for part in (accepted, rejected, stats, blocked, throttled, shadow, per_plane):
        table = table.join(part, "second", "left")
    counts = ["accepted", *[f"rejected_{r}" for r in REJECT_REASONS], "throttled_clients",
              "throttle_ms", "pool_depleted_ms", "acceptor_blocked_ratio", "shadow_rejected",
              "shadow_throttle_ms",
              *[f"{plane}_requests" for plane in PLANES]]
    table = table.fillna(0, subset=counts)
    table = table.withColumn("rejected", sum(F.col(f"rejected_{r}") for r in REJECT_REASONS))
    return table.orderBy("second")


def _top(frame: DataFrame, dimension: str, key: str, metric: str, value, n: int) -> DataFrame:
    ranked = Window.orderBy(F.col("value").desc(), F.col("key"))
    return (frame.where(F.col(key).isNotNull() & (F.col(key) != OTHER))
            .groupBy(F.col(key).alias("key"))
            .agg(value.alias("value"))
            .withColumn("rank", F.row_number().over(ranked)).where(F.col("rank") <= n)
            .select(F.lit(dimension).alias("dimension"), "key", F.lit(metric).alias("metric"),
                    F.col("value").cast("double").alias("value"), "rank"))


def top_n(events: DataFrame, n: int = 10) -> DataFrame:
    count = F.count(F.lit(1))
    parts = [
        _top(_of(events, "connection_accepted"), "ip", "ip", "connections", count, n),
        _top(_of(events, "connection_rejected"), "ip", "ip", "rejections", count, n),
        _top(_of(events, "connection_closed"), "ip", "ip", "bytes",
             F.sum(F.col("bytes_in") + F.col("bytes_out")), n),
        _top(_of(events, "connection_closed"), "client_id", "client_id", "connections", count, n),
        _top(_of(events, "requests"), "client_id", "client_id", "requests", F.sum("count"), n),
        _top(_of(events, "requests"), "client_id", "client_id", "bytes",
             F.sum(F.col("bytes_in") + F.col("bytes_out")), n),
        _top(_of(events, "throttle"), "client_id", "client_id", "throttle_ms",
             F.sum("throttle_ms"), n),
        # Principals (issue 16): who, beyond an address and a client id, drove the load.
        _top(_of(events, "throttle").where(F.col("user") != "ANONYMOUS"), "user", "user",
             "throttle_ms", F.sum("throttle_ms"), n),
        _top(_of(events, "connection_closed").where(F.col("principal") != "User:ANONYMOUS"),
             "principal", "principal", "connections", count, n),
        _top(_of(events, "connection_rejected"), "principal", "principal", "rejections",
             count, n),
        _top(_of(events, "authorization_denied"), "principal", "principal", "denials",
             F.sum("count"), n),
        _top(_of(events, "authentication_failed"), "ip", "ip", "authentication_failures",
             count, n),
        _top(_of(events, "authentication_failed"), "user", "user", "authentication_failures",
             count, n),
        _top(_of(events, "connection_rejected", dry_run=True), "ip", "ip", "shadow_rejections",
             count, n),
        _top(_of(events, "throttle", dry_run=True), "client_id", "client_id",
             "shadow_throttle_ms", F.sum("throttle_ms"), n),
    ]
    table = parts[0]
    for part in parts[1:]:
        table = table.unionByName(part)
    return table.orderBy("dimension", "metric", "rank")


def incidents(events: DataFrame, per_second: DataFrame,
              limits: Thresholds = Thresholds()) -> DataFrame:
    """Join flagged seconds into incidents; name who drove each one."""
    flagged = per_second.where(
        (F.col("rejected") >= limits.rejected_per_second)
        | (F.col("acceptor_blocked_ratio") >= limits.blocked_ratio)
        | (F.col("pool_depleted_ms") >= limits.depleted_ms))
    ordered = Window.orderBy("second")
    islands = (flagged.withColumn("previous", F.lag("second").over(ordered))
               .withColumn("starts", F.when(F.col("previous").isNull() |
                                            (F.col("second") - F.col("previous")
                                             > limits.gap_seconds + 1), 1).otherwise(0))
               .withColumn("incident", F.sum("starts").over(ordered)))
    summary = islands.groupBy("incident").agg(
        F.min("second").alias("start"), F.max("second").alias("end"),
        F.max("rejected").alias("peak_rejected_per_s"),
        F.max("acceptor_blocked_ratio").alias("peak_blocked_ratio"),
        F.max("pool_depleted_ms").alias("peak_depleted_ms"),
        F.max("throttled_clients").alias("peak_throttled_clients"))
    summary = summary.withColumn("seconds", F.col("end") - F.col("start") + 1)
    windowed = F.col("e.second").between(F.col("s.start"), F.col("s.end"))
    events = events.where(F.coalesce(F.col("client_id"), F.lit("")) != OTHER)
    connections = events.where(F.col("type").isin("connection_accepted", "connection_rejected"))
    by_ip = _leader(summary, connections, windowed, "ip", F.count(F.lit(1)), "top_ip")
    clients = events.where(F.col("type") == "requests")
    by_client = _leader(summary, clients, windowed, "client_id",
                        F.sum(F.col("bytes_in") + F.col("bytes_out")), "top_client_id")
    throttled = events.where(F.col("type") == "throttle")
    by_throttle = _leader(summary, throttled, windowed, "client_id", F.sum("throttle_ms"),
                          "most_throttled_client_id")
    denials = events.where(F.col("type") == "authorization_denied")
    by_principal = _leader(summary, denials, windowed, "principal", F.sum("count"),
                           "most_denied_principal")
    by_resource = _leader(summary, denials, windowed, "resource", F.sum("count"),
                          "most_denied_resource")
    denied_count = (summary.alias("s").join(denials.alias("e"), windowed)
                    .groupBy(F.col("s.incident").alias("incident"))
                    .agg(F.sum("e.count").alias("denied_requests")))
    return (summary.join(by_ip, "incident", "left").join(by_client, "incident", "left")
            .join(by_throttle, "incident", "left").join(denied_count, "incident", "left")
            .join(by_principal, "incident", "left").join(by_resource, "incident", "left")
            .fillna(0, subset=["denied_requests"]).orderBy("start"))


def denied(events: DataFrame) -> DataFrame:
    """The "denied requests" table: who was refused what by the ACLs, most denied first."""
    return (_of(events, "authorization_denied")
            .groupBy("principal", "api", "resource_type", "resource", "operation")
            .agg(F.sum("count").alias("denials"), F.countDistinct("ip").alias("ips"),
                 F.min("second").alias("first_second"), F.max("second").alias("last_second"))
            .orderBy(F.col("denials").desc(), "principal", "api", "resource"))


def _leader(summary: DataFrame, events: DataFrame, windowed, key: str, value,
            name: str) -> DataFrame:
    """Per incident, the `key` with the largest `value` among the events inside it."""
    joined = (summary.alias("s").join(events.alias("e"), windowed)
              .where(F.col(f"e.{key}").isNotNull())
              .groupBy(F.col("s.incident").alias("incident"), F.col(f"e.{key}").alias("key"))
              .agg(value.alias("value")))
    best = Window.partitionBy("incident").orderBy(F.col("value").desc(), F.col("key"))
    return (joined.withColumn("rank", F.row_number().over(best)).where(F.col("rank") == 1)
            .select("incident", F.col("key").alias(name)))


def fairness(events: DataFrame, window: int = 10) -> DataFrame:
    """Jain's fairness index over served requests per client id, per window of seconds."""
    served = (_of(events, "requests").where(F.col("client_id").isNotNull()
                                            & (F.col("client_id") != OTHER))
              .withColumn("window_start", F.floor(F.col("second") / window) * window)
              .groupBy("window_start", "client_id").agg(F.sum("count").alias("x")))
    return (served.groupBy("window_start").agg(
        F.count(F.lit(1)).alias("clients"), F.sum("x").alias("requests"),
        (F.pow(F.sum("x"), 2) / (F.count(F.lit(1)) * F.sum(F.col("x") * F.col("x"))))
        .alias("jain_index"))
        .orderBy("window_start"))
