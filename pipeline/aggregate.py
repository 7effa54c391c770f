"""The incident tables, each a function from the events DataFrame (pipeline.load) to a table.

timeline    one row per second from the first event to the last: connections accepted and
            rejected (in all and by reason), active connections, the worst acceptor's blocked
            ratio, pool used and depleted time, memory mutes, distinct throttled clients and
            their throttle time, and per plane the request rate with p50/p99 latency from the
            merged sketches
top_n       the N biggest IPs, client ids, users and principals by connections, rejections,
            bytes, throttle time, failed authentications and transactional ids refused; and
            by what limits in shadow mode would have done (shadow_rejections,
            shadow_throttle_ms)

Shadow mode: events with `dry_run` set are what a limit observing only would have
done.  They are kept out of every enforced count (rejections, throttles, incidents) and
counted apart: `shadow_rejected` and `shadow_throttle_ms` per second in the timeline.
incidents   runs of seconds where rejections, acceptor blocking, pool depletion, throttling or
            control-plane requests pass their thresholds (quiet gaps up to `gap` seconds
            joined), with start, end, peaks, and per dimension of what happened inside (IPs
            and principals refused, refusals by reason, clients by bytes, clients and quotas
            by throttle time, control-plane clients, acceptor blocking by reason, mutes, ACL
            denials, transactional ids refused by holder) the total, the leaders and how many keys: `totals`, `leaders` and `keys`
            maps, and the leaders that name an incident as columns of their own (top_ip,
            top_client_id, ...)
impact      per incident, the clients that were already there (served both in the quiet
            `before` seconds ahead of it and during it): requests and p99 before and during
denied      the requests the ACLs denied: per principal, API, resource and operation, how
            many, from how many addresses, first and last second
groups      per consumer, classic or share group (group_rebalance, share_deliveries events):
            its type, how many rebalances (classic rebalances started, consumer-group epoch
            bumps), the most common reasons, the most members seen; for a share group the
            records acquired, redelivered and how acquisitions ended (accepted, released,
            rejected, lock expired, archived at the delivery limit); the `n` heaviest groups
            (rebalances plus redeliveries), each row also carrying `groups` (how many the log
            names), `types` {group_type: groups} and `totals` {column: sum over every group}
fairness    per window of `window` seconds, Jain's index over the clients' served requests:
            (sum x)^2 / (n * sum x^2), 1 when all got the same, 1/n when one got everything
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

# shm.block.REJECT_REASONS: a column per known reason; `rejected` counts any reason.
REJECT_REASONS = ("per_ip_limit", "per_ip_rate", "evicted", "per_user_limit", "per_user_rate",
                  "proxy_untrusted", "proxy_invalid", "proxy_timeout")
OTHER = "<other>"  # workers.worker_events: clients past a worker's key limit, not one client
MAX_FILLED_SECONDS = 7 * 86400
PLANES = ("data", "control")
LEADERS = 5  # leaders kept per incident and dimension
BEFORE_SECONDS = 30  # how far before an incident `impact` looks for its quiet baseline
REASONS_KEPT = 3  # rebalance reasons kept per group, the most common first
GROUP_TYPES = ("classic", "consumer", "share")  # KIP-848 groups are "consumer"
# ShareDeliveries' counts: what share groups did with their records.
DELIVERIES = ("acquired", "redelivered", "accepted", "released", "rejected", "lock_expired",
              "delivery_limit")


@dataclass(frozen=True)
class Thresholds:
    rejected_per_second: int = 10
    blocked_ratio: float = 0.5
    depleted_ms: float = 500.0
    throttled_ms: float = 500.0  # throttle time handed out in one second, all clients
    control_requests_per_second: int = 100
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


QUANTILES = (("p50_ms", 0.5), ("p99_ms", 0.99))


def latency_percentiles(events: DataFrame, keys: list[str], quantiles=QUANTILES) -> DataFrame:
    """Per `keys`: requests, and each quantile as the upper bound of the bucket reaching it."""
    return sketch_percentiles(_of(events, "requests"), keys, quantiles)


def sketch_percentiles(requests: DataFrame, keys: list[str], quantiles=QUANTILES) -> DataFrame:
    """latency_percentiles over `requests` events already chosen (and tagged with `keys`)."""
    buckets = (requests
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
    if span["lo"] is None:  # no events: no rows, but every column the other tables read
        seconds = spark.createDataFrame([], "second long")
    elif span["hi"] - span["lo"] <= MAX_FILLED_SECONDS:  # every second, quiet ones as zeros
        seconds = spark.range(span["lo"], span["hi"] + 1).withColumnRenamed("id", "second")
    else:  # logs far apart in time: only the seconds that have events
        seconds = events.select("second").distinct()
    accepted = _of(events, "connection_accepted").groupBy("second").agg(
        F.count(F.lit(1)).alias("accepted"))
    rejected = (_of(events, "connection_rejected").groupBy("second")
                .pivot("reason", list(REJECT_REASONS)).agg(F.count(F.lit(1))))
    for reason in REJECT_REASONS:
        rejected = rejected.withColumnRenamed(reason, f"rejected_{reason}")
    rejected = rejected.join(_of(events, "connection_rejected").groupBy("second").agg(
        F.count(F.lit(1)).alias("rejected")), "second")
    mutes = _of(events, "memory_mutes").groupBy("second").agg(F.sum("muted").alias("muted"))
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
    for part in (accepted, rejected, mutes, stats, blocked, throttled, shadow, per_plane):
        table = table.join(part, "second", "left")
    counts = ["accepted", "rejected", *[f"rejected_{r}" for r in REJECT_REASONS], "muted",
              "throttled_clients",
              "throttle_ms", "pool_depleted_ms", "acceptor_blocked_ratio", "shadow_rejected",
              "shadow_throttle_ms",
              *[f"{plane}_requests" for plane in PLANES]]
    return table.fillna(0, subset=counts).orderBy("second")


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
        # Principals: who, beyond an address and a client id, drove the load.
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
        _top(_of(events, "transactional_id_refused"), "principal", "principal",
             "transactional_id_refusals", F.sum("count"), n),
        _top(_of(events, "transactional_id_refused"), "ip", "ip", "transactional_id_refusals",
             F.sum("count"), n),
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


def flagged_seconds(per_second: DataFrame, limits: Thresholds) -> DataFrame:
    """The seconds where something passed its threshold."""
    return per_second.where(
        (F.col("rejected") >= limits.rejected_per_second)
        | (F.col("acceptor_blocked_ratio") >= limits.blocked_ratio)
        | (F.col("pool_depleted_ms") >= limits.depleted_ms)
        | (F.col("throttle_ms") >= limits.throttled_ms)
        | (F.col("control_requests") >= limits.control_requests_per_second))


def incidents(events: DataFrame, per_second: DataFrame,
              limits: Thresholds = Thresholds()) -> DataFrame:
    """Join flagged seconds into incidents; total and name who and what drove each one."""
    ordered = Window.orderBy("second")
    islands = (flagged_seconds(per_second, limits)
               .withColumn("previous", F.lag("second").over(ordered))
               .withColumn("starts", F.when(F.col("previous").isNull() |
                                            (F.col("second") - F.col("previous")
                                             > limits.gap_seconds + 1), 1).otherwise(0))
               .withColumn("incident", F.sum("starts").over(ordered)))
    summary = islands.groupBy("incident").agg(
        F.min("second").alias("start"), F.max("second").alias("end"),
        F.max("rejected").alias("peak_rejected_per_s"),
        F.max("acceptor_blocked_ratio").alias("peak_blocked_ratio"),
        F.max("pool_depleted_ms").alias("peak_depleted_ms"),
        F.max("throttled_clients").alias("peak_throttled_clients"),
        F.max("throttle_ms").alias("peak_throttle_ms"),
        F.max("control_requests").alias("peak_control_requests"))
    summary = summary.withColumn("seconds", F.col("end") - F.col("start") + 1)
    found = summary.join(_inside(events, summary), "incident", "left")
    named = {"top_ip": "ip", "top_client_id": "client_bytes",
             "most_throttled_client_id": "throttled_client",
             "most_denied_principal": "denied_principal",
             "most_denied_resource": "denied_resource"}
    for column, dimension in named.items():
        found = found.withColumn(column, _first_leader(dimension))
    denied_total = F.try_element_at("totals", F.lit("denied_principal"))
    return (found.withColumn("denied_requests", F.coalesce(denied_total, F.lit(0.0))
                             .cast("long")).orderBy("start"))


def _first_leader(dimension: str):
    leaders = F.try_element_at("leaders", F.lit(dimension))
    return F.try_element_at(leaders, F.lit(1)).getField("key")


def _contributions(events: DataFrame) -> DataFrame:
    """Each event as (second, dimension, key, value) rows: what it adds to which dimension of
    an incident.  One pass over the events for every dimension."""
    kind = F.col("type")
    enforced = F.coalesce(F.col("dry_run"), F.lit(False)) == F.lit(False)
    rejected = (kind == "connection_rejected") & enforced
    served = kind == "requests"
    throttled = (kind == "throttle") & enforced
    denials = kind == "authorization_denied"
    one = F.lit(1)
    parts = [
        (kind.isin("connection_accepted", "connection_rejected"), "ip", F.col("ip"), one),
        (rejected, "rejected_ip", F.col("ip"), one),
        # Only the per-user reasons name a principal: no null key to total.
        (rejected & F.col("principal").isNotNull(), "rejected_principal", F.col("principal"),
         one),
        (rejected, "rejected_reason", F.col("reason"), one),
        (served, "client_bytes", F.col("client_id"), F.col("bytes_in") + F.col("bytes_out")),
        (served & (F.col("plane") == "control"), "control_client", F.col("client_id"),
         F.col("count")),
        (throttled, "throttled_client", F.col("client_id"), F.col("throttle_ms")),
        (throttled, "throttle_quota", F.col("quota"), F.col("throttle_ms")),
        (denials, "denied_principal", F.col("principal"), F.col("count")),
        (denials, "denied_resource", F.col("resource"), F.col("count")),
        # The transaction coordinator's holder: the principal, or its address if ANONYMOUS.
        (kind == "transactional_id_refused", "txn_refused_holder",
         F.when(F.col("principal") == "User:ANONYMOUS",
                F.concat(F.col("principal"), F.lit("@"), F.col("ip")))
         .otherwise(F.col("principal")), F.col("count")),
        (kind == "acceptor_blocked", "blocked_reason", F.col("reason"), F.col("blocked_ms")),
        (kind == "broker_stats", "depleted_node", F.col("node"), F.col("depleted_ms")),
        (kind == "memory_mutes", "muted_proc", F.col("proc"), F.col("muted")),
    ]
    entries = F.array(*[F.when(test, F.struct(F.lit(dimension).alias("dimension"),
                                              key.cast("string").alias("key"),
                                              amount.cast("double").alias("value")))
                        for test, dimension, key, amount in parts])
    return (events.select("second", F.explode(F.filter(entries, lambda e: e.isNotNull()))
                          .alias("c"))
            .select("second", "c.*"))


def _inside(events: DataFrame, summary: DataFrame) -> DataFrame:
    """Per incident: `totals` {dimension: sum}, `leaders` {dimension: [{key, value}]} (the
    LEADERS largest, named keys only: not a client past a worker's key limit) and `keys`
    {dimension: how many named keys}."""
    inside = (_contributions(events).join(_seconds_of(summary, "start", "end"), "second")
              .groupBy("incident", "dimension", "key").agg(F.sum("value").alias("value")))
    totals = (inside.groupBy("incident", "dimension").agg(F.sum("value").alias("total"))
              .groupBy("incident").agg(F.map_from_entries(
                  F.collect_list(F.struct("dimension", "total"))).alias("totals")))
    named = inside.where(F.col("key").isNotNull() & (F.col("key") != OTHER))
    keys = (named.groupBy("incident", "dimension").agg(F.count(F.lit(1)).alias("n"))
            .groupBy("incident").agg(F.map_from_entries(
                F.collect_list(F.struct("dimension", "n"))).alias("keys")))
    best = Window.partitionBy("incident", "dimension").orderBy(F.col("value").desc(), "key")
    ranked = (named.withColumn("rank", F.row_number().over(best)).where(F.col("rank") <= LEADERS)
              .groupBy("incident", "dimension")
              .agg(F.array_sort(F.collect_list(F.struct("rank", "key", "value"))).alias("top"))
              .withColumn("top", F.transform("top", lambda e: F.struct(
                  e.getField("key").alias("key"), e.getField("value").alias("value"))))
              .groupBy("incident").agg(F.map_from_entries(
                  F.collect_list(F.struct("dimension", "top"))).alias("leaders")))
    return totals.join(ranked, "incident", "left").join(keys, "incident", "left")


def _seconds_of(spans: DataFrame, first: str, last: str) -> DataFrame:
    """(incident, second) for every second from `first` to `last` of each incident, small
    enough to broadcast: events then join it on equal seconds (a hash join, not a range
    comparison of every event with every incident)."""
    return F.broadcast(spans.select("incident", F.explode(F.sequence(first, last))
                                    .alias("second")))


def impact(events: DataFrame, incident_table: DataFrame,
           before_seconds: int = BEFORE_SECONDS) -> DataFrame:
    """Per incident, each client served both before it (in the `before_seconds` ahead of its
    start that are in no incident) and during it: requests and p99 in both."""
    during = _seconds_of(incident_table, "start", "end")
    ahead = (incident_table.withColumn("from", F.col("start") - before_seconds)
             .withColumn("to", F.col("start") - 1))
    quiet_before = (_seconds_of(ahead, "from", "to")
                    .join(during.select("second"), "second", "left_anti"))
    served = (_of(events, "requests")
              .where(F.col("client_id").isNotNull() & (F.col("client_id") != OTHER))
              .select("second", "client_id", "latency"))
    tagged = (served.join(during, "second").withColumn("phase", F.lit("during"))
              .unionByName(served.join(F.broadcast(quiet_before), "second")
                           .withColumn("phase", F.lit("before"))))
    found = sketch_percentiles(tagged, ["incident", "client_id", "phase"],
                               quantiles=(("p99_ms", 0.99),))
    return (found.groupBy("incident", "client_id").pivot("phase", ["before", "during"])
            .agg(F.first("requests").alias("requests"), F.first("p99_ms").alias("p99_ms"))
            .where(F.col("before_requests").isNotNull() & F.col("during_requests").isNotNull())
            .orderBy("incident", "client_id"))


def denied(events: DataFrame) -> DataFrame:
    """The "denied requests" table: who was refused what by the ACLs, most denied first."""
    return (_of(events, "authorization_denied")
            .groupBy("principal", "api", "resource_type", "resource", "operation")
            .agg(F.sum("count").alias("denials"), F.countDistinct("ip").alias("ips"),
                 F.min("second").alias("first_second"), F.max("second").alias("last_second"))
            .orderBy(F.col("denials").desc(), "principal", "api", "resource"))


def groups(events: DataFrame, n: int = 10) -> DataFrame:
    """The "groups" table (see the module docstring): the n heaviest groups, heaviest first.
    A column a group's events cannot tell is null, not 0: the deliveries of a group that is
    not a share group, the rebalances of a share group whose rebalances the log does not hold.
    Two aggregations, a join and one window: on these few rows every shuffle is the cost."""
    count = F.count(F.lit(1))
    by_reason = _of(events, "group_rebalance").groupBy("group", "reason").agg(
        count.alias("count"), F.max_by("group_type", "ts").alias("group_type"),
        F.max("ts").alias("ts"), F.max("members").alias("most_members"),
        F.min("second").alias("rebalance_first"), F.max("second").alias("rebalance_last"))
    # Most common first, ties by name: sorting (-count, reason) and keeping the first few.
    common = F.slice(F.array_sort(F.collect_list(F.struct(
        (-F.col("count")).alias("order"), "reason", "count"))), 1, REASONS_KEPT)
    rebalanced = by_reason.groupBy("group").agg(
        F.sum("count").alias("rebalances"), F.max_by("group_type", "ts").alias("group_type"),
        F.max("most_members").alias("most_members"),
        F.transform(common, lambda e: F.struct(e.getField("reason").alias("reason"),
                                               e.getField("count").alias("count")))
        .alias("reasons"), count.alias("reason_kinds"),
        F.min("rebalance_first").alias("rebalance_first"),
        F.max("rebalance_last").alias("rebalance_last"))
    delivered = _of(events, "share_deliveries").groupBy("group").agg(
        *[F.sum(column).alias(column) for column in DELIVERIES],
        F.countDistinct("topic", "partition").alias("share_partitions"),
        F.min("second").alias("delivery_first"), F.max("second").alias("delivery_last"))
    table = (rebalanced.join(delivered, "group", "full")
             .withColumn("group_type", F.coalesce("group_type", F.lit("share")))
             .withColumn("first_second", F.least("rebalance_first", "delivery_first"))
             .withColumn("last_second", F.greatest("rebalance_last", "delivery_last"))
             .drop("rebalance_first", "rebalance_last", "delivery_first", "delivery_last"))
    # Every group in one window (no ordering): the totals, next to the ranking's window.
    every = Window.partitionBy()
    summed = ("rebalances", *DELIVERIES)
    totals = F.create_map(*[part for column in summed for part in (
        F.lit(column), F.coalesce(F.sum(column).over(every), F.lit(0)))])
    types = F.create_map(*[part for kind in GROUP_TYPES for part in (
        F.lit(kind), F.sum((F.col("group_type") == kind).cast("long")).over(every))])
    weight = F.coalesce("rebalances", F.lit(0)) + F.coalesce("redelivered", F.lit(0))
    heaviest = Window.orderBy(weight.desc(), F.coalesce("acquired", F.lit(0)).desc(), "group")
    return (table.withColumn("rank", F.row_number().over(heaviest))
            .withColumn("groups", F.count(F.lit(1)).over(every))
            .withColumn("totals", totals)
            .withColumn("types", F.map_filter(types, lambda _kind, n: n > 0))
            .where(F.col("rank") <= n).orderBy("rank"))


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
