"""The PySpark pipeline's aggregations on small hand-written event files with known answers."""

import json
import os
import re

import msgspec
import pytest

from broker.shared import events as ev
from broker.shared.events import bucket_upper, latency_bucket
from pipeline import aggregate
from pipeline.job import run
from pipeline.load import load_events
from tests.observability.helpers import TEST_JVM_OPTIONS, submit_args

pytestmark = pytest.mark.system  # every test here runs Spark (a JVM)

T0 = 1_790_000_000  # an epoch second


def write(directory, items, name="events-1.jsonl"):
    """Events (structs) or raw lines (bytes) into one file; return the directory."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as handle:
        for item in items:
            if isinstance(item, bytes):
                handle.write(item + b"\n")
                continue
            item.node, item.proc = item.node or 0, item.proc or "data-0"
            handle.write(msgspec.json.encode(item) + b"\n")
    return str(directory)


def at(second: int, offset_ms: int = 0) -> int:
    return (T0 + second) * 1000 + offset_ms


def accepted(second, ip="10.0.0.1"):
    return ev.ConnectionAccepted(ts=at(second, 5), listener="CLIENT", ip=ip, port=1, conn_id=1)


def rejected(second, reason="per_ip_limit", ip="10.0.0.9"):
    return ev.ConnectionRejected(ts=at(second, 7), listener="CLIENT", ip=ip, reason=reason)


def requests(second, client, count, latency, plane="data", bytes_in=100):
    return ev.Requests(ts=at(second), second=T0 + second, listener="CLIENT", plane=plane,
                       api="Produce", client_id=client, count=count, bytes_in=bytes_in,
                       bytes_out=10, latency_us_sum=0, latency=latency)


def rows_by_second(table):
    return {row["second"] - T0: row for row in table.collect()}


def test_latency_sketch_bounds_every_value_within_a_quarter():
    for microseconds in [0, 1, 7, 8, 9, 10, 15, 16, 100, 999, 1000, 123456, 10**9]:
        bucket = latency_bucket(microseconds)
        assert microseconds < bucket_upper(bucket) <= max(microseconds * 1.25 + 1, 1)


def test_timeline_counts_ratios_and_percentiles(spark, tmp_path):
    fast, slow = latency_bucket(100), latency_bucket(10_000)
    directory = write(tmp_path, [
        accepted(0), accepted(0), accepted(0, ip="10.0.0.2"),
        rejected(1), rejected(1), rejected(1, "per_ip_rate"), rejected(1, "per_user_limit"),
        ev.MemoryMutes(ts=at(2), muted=7, unmuted=5),
        ev.BrokerStats(ts=at(0), active={"CLIENT": 2, "CONTROLLER": 3}, pool_used=7,
                       pool_limit=10, depleted_ms=250.0),
        ev.AcceptorBlocked(ts=at(1), listener="CLIENT", reason="connection_limit",
                           episodes=2, blocked_ms=500.0),
        ev.AcceptorBlocked(ts=at(1), listener="CONTROLLER", reason="handoff_full",
                           episodes=1, blocked_ms=200.0),
        ev.Throttle(ts=at(2, 1), client_id="x", quota="producer_byte_rate", throttle_ms=30),
        ev.Throttle(ts=at(2, 2), client_id="y", quota="request_percentage", throttle_ms=5),
        ev.Throttle(ts=at(2, 3), client_id="x", quota="producer_byte_rate", throttle_ms=30),
        # Two processes' sketches for one second add up: 98 fast, 2 slow requests.
        requests(0, "a", 60, {fast: 60}),
        requests(0, "b", 40, {fast: 38, slow: 2}),
        requests(0, "admin", 4, {fast: 4}, plane="control"),
        accepted(4),  # second 3 has nothing: it is still a row, of zeros
        # Shadow mode: what limits observing only would have done, counted apart.
        ev.ConnectionRejected(ts=at(1, 9), listener="CLIENT", ip="10.0.0.7",
                              reason="per_ip_limit", dry_run=True),
        ev.Throttle(ts=at(2, 4), client_id="z", quota="producer_byte_rate", throttle_ms=70,
                    dry_run=True),
    ])
    loaded = load_events(spark, [directory])
    assert (loaded.lines, loaded.bad_lines, loaded.unknown_version) == (20, 0, 0)
    table = rows_by_second(aggregate.timeline(loaded.events))
    assert sorted(table) == [0, 1, 2, 3, 4]
    assert [table[s]["accepted"] for s in range(5)] == [3, 0, 0, 0, 1]
    assert table[1]["rejected_per_ip_limit"] == 2 and table[1]["rejected_per_ip_rate"] == 1
    assert table[1]["rejected_per_user_limit"] == 1
    assert table[1]["rejected"] == 4 and table[0]["rejected"] == 0  # any reason counts
    assert table[2]["muted"] == 7 and table[1]["muted"] == 0
    assert table[0]["active"] == 5 and table[0]["pool_used"] == 7
    assert table[0]["pool_depleted_ms"] == 250.0
    assert table[1]["acceptor_blocked_ratio"] == 0.5  # the worst acceptor, not the sum
    assert table[2]["throttled_clients"] == 2 and table[2]["throttle_ms"] == 65
    assert table[1]["shadow_rejected"] == 1 and table[2]["shadow_throttle_ms"] == 70
    assert table[0]["shadow_rejected"] == 0 and table[1]["shadow_throttle_ms"] == 0
    assert table[0]["data_requests"] == 100 and table[0]["control_requests"] == 4
    assert table[0]["data_p50_ms"] == bucket_upper(fast) / 1000
    assert table[0]["data_p99_ms"] == bucket_upper(slow) / 1000
    assert table[0]["control_p99_ms"] == bucket_upper(fast) / 1000
    assert table[3]["accepted"] == 0 and table[3]["data_requests"] == 0


def test_top_n_ranks_ips_and_clients(spark, tmp_path):
    directory = write(tmp_path, [
        accepted(0, "10.0.0.1"), accepted(0, "10.0.0.1"), accepted(0, "10.0.0.2"),
        rejected(0, ip="10.0.0.3"),
        requests(0, "big", 1, {1: 1}, bytes_in=5000), requests(0, "small", 9, {1: 9}),
        ev.Throttle(ts=at(0), client_id="small", quota="producer_byte_rate", throttle_ms=40),
        ev.ConnectionRejected(ts=at(0), listener="CLIENT", ip="10.0.0.8", reason="per_ip_limit",
                              dry_run=True),
        ev.ConnectionRejected(ts=at(0), listener="CLIENT", ip="10.0.0.8", reason="per_ip_limit",
                              dry_run=True),
        ev.Throttle(ts=at(0), client_id="big", quota="producer_byte_rate", throttle_ms=90,
                    dry_run=True),
    ])
    top = aggregate.top_n(load_events(spark, [directory]).events, n=1).collect()
    found = {(row["dimension"], row["metric"]): (row["key"], row["value"]) for row in top}
    assert found[("ip", "connections")] == ("10.0.0.1", 2)
    assert found[("ip", "rejections")] == ("10.0.0.3", 1)
    assert found[("client_id", "bytes")] == ("big", 5010)
    assert found[("client_id", "requests")] == ("small", 9)
    assert found[("client_id", "throttle_ms")] == ("small", 40)
    assert found[("ip", "shadow_rejections")] == ("10.0.0.8", 2)  # not among the enforced
    assert found[("client_id", "shadow_throttle_ms")] == ("big", 90)
    assert all(row["rank"] == 1 for row in top)


def test_top_n_names_users_principals_and_failed_authentications(spark, tmp_path):
    directory = write(tmp_path, [
        ev.Throttle(ts=at(0), client_id="app", user="alice", quota="producer_byte_rate",
                    throttle_ms=300),
        ev.Throttle(ts=at(0), client_id="app", quota="producer_byte_rate", throttle_ms=900),
        ev.ConnectionClosed(ts=at(1), listener="SASL", ip="10.0.0.1", conn_id=1,
                            reason="client", principal="User:bob", lifetime_ms=5, bytes_in=1,
                            bytes_out=1),
        *[ev.AuthenticationFailed(ts=at(2), listener="SASL", ip="10.6.6.6", mechanism="PLAIN",
                                  user="root") for _ in range(3)],
        *[ev.ConnectionRejected(ts=at(3), listener="SASL", ip="10.0.0.9", reason="per_user_limit",
                                principal="User:svc") for _ in range(2)],
        ev.ConnectionRejected(ts=at(3), listener="SASL", ip="10.0.0.8", reason="per_ip_limit"),
    ])
    top = aggregate.top_n(load_events(spark, [directory]).events, n=1).collect()
    found = {(row["dimension"], row["metric"]): (row["key"], row["value"]) for row in top}
    assert found[("user", "throttle_ms")] == ("alice", 300)  # ANONYMOUS is not a name
    assert found[("principal", "connections")] == ("User:bob", 1)
    assert found[("ip", "authentication_failures")] == ("10.6.6.6", 3)
    assert found[("user", "authentication_failures")] == ("root", 3)
    assert found[("principal", "rejections")] == ("User:svc", 2)  # per-user limits


@pytest.mark.long  # 14 s of Spark: `make compat` (make test stays under its 15 minutes)
def test_refused_transactional_ids_name_their_holder(spark, tmp_path):
    """transactional_id_refused events: principals and IPs ranked, and an incident says how
    many times and to whom (an ANONYMOUS holder is its address)."""
    from pipeline import words

    def refused(second, principal, ip, count):
        return ev.TransactionalIdRefused(ts=at(second), second=T0 + second, listener="CLIENT",
                                         ip=ip, principal=principal, reason="share", held=4,
                                         count=count)

    storm = [rejected(10, ip="10.6.6.6") for _ in range(12)]
    directory = write(tmp_path, [*storm, refused(10, "User:ANONYMOUS", "10.6.6.6", 30),
                                 refused(10, "User:alice", "10.0.0.2", 5)])
    events = load_events(spark, [directory]).events
    top = aggregate.top_n(events, n=1).collect()
    found = {(row["dimension"], row["metric"]): (row["key"], row["value"]) for row in top}
    assert found[("principal", "transactional_id_refusals")] == ("User:ANONYMOUS", 30)
    assert found[("ip", "transactional_id_refusals")] == ("10.6.6.6", 30)
    (incident,) = [row.asDict(recursive=True) for row in
                   aggregate.incidents(events, aggregate.timeline(events)).collect()]
    assert incident["totals"]["txn_refused_holder"] == 35
    assert "refused transactional ids 35 times (a principal's share or the whole table in " \
        "transactions), most to User:ANONYMOUS@10.6.6.6" in words.actions(incident)


def denial(second, principal, resource, count, api="Produce", operation="WRITE", ip="10.0.0.5"):
    return ev.AuthorizationDenied(ts=at(second), second=T0 + second, listener="SASL", ip=ip,
                                  principal=principal, api=api, resource_type="TOPIC",
                                  resource=resource, operation=operation, count=count)


@pytest.mark.long  # 21 s of Spark: `make compat`; test_report tells a whole incident in make test
def test_incidents_join_close_seconds_and_name_who_drove_them(spark, tmp_path):
    fast, slow = latency_bucket(200), latency_bucket(40_000)
    storm = [rejected(s, ip="10.6.6.6") for s in (10, 11, 13) for _ in range(12)]
    directory = write(tmp_path, [
        accepted(0), *storm, rejected(11, ip="10.0.0.1"),
        *[rejected(12, "per_user_limit", ip="10.0.0.5") for _ in range(2)],
        ev.ConnectionRejected(ts=at(12), listener="SASL", ip="10.0.0.5", reason="per_user_limit",
                              principal="User:svc"),
        denial(11, "User:mallory", "payments", 40), denial(12, "User:alice", "orders", 3),
        denial(50, "User:bob", "late", 9),  # outside every incident
        # "mouse" was served before the storm (quiet second 5) and during it, slower.
        requests(5, "mouse", 20, {fast: 20}), requests(11, "mouse", 5, {slow: 5}),
        requests(11, "hog", 5, {1: 5}, bytes_in=10**6),
        ev.BrokerStats(ts=at(30), active={"CLIENT": 1}, depleted_ms=800.0),
        ev.MemoryMutes(ts=at(30), muted=9, unmuted=9),
        ev.Throttle(ts=at(30), client_id="hog", quota="producer_byte_rate", throttle_ms=700),
        # Throttling alone, then control-plane load alone, each past its threshold.
        ev.Throttle(ts=at(60), client_id="greedy", quota="producer_byte_rate", throttle_ms=600),
        requests(70, "admin", 150, {fast: 150}, plane="control"),
        accepted(80),
    ])
    events = load_events(spark, [directory]).events
    per_second = aggregate.timeline(events).cache()  # read three times below
    table = aggregate.incidents(events, per_second).cache()
    found = table.collect()
    assert [(row["start"] - T0, row["end"] - T0, row["seconds"]) for row in found] == \
        [(10, 13, 4), (30, 30, 1), (60, 60, 1), (70, 70, 1)]
    storm_incident, depletion, throttling, control = found
    assert storm_incident["peak_rejected_per_s"] == 13
    assert storm_incident["top_ip"] == "10.6.6.6"
    assert storm_incident["top_client_id"] == "hog"
    assert storm_incident["totals"]["rejected_reason"] == 40
    assert [(e["key"], e["value"]) for e in storm_incident["leaders"]["rejected_ip"]] == \
        [("10.6.6.6", 36), ("10.0.0.5", 3), ("10.0.0.1", 1)]
    assert [(e["key"], e["value"]) for e in storm_incident["leaders"]["rejected_reason"]] == \
        [("per_ip_limit", 37), ("per_user_limit", 3)]
    assert [e["key"] for e in storm_incident["leaders"]["rejected_principal"]] == ["User:svc"]
    assert storm_incident["keys"]["rejected_ip"] == 3
    assert (storm_incident["denied_requests"], storm_incident["most_denied_principal"],
            storm_incident["most_denied_resource"]) == (43, "User:mallory", "payments")
    assert depletion["denied_requests"] == 0 and depletion["most_denied_principal"] is None
    assert depletion["peak_depleted_ms"] == 800.0
    assert depletion["most_throttled_client_id"] == "hog"
    assert (depletion["totals"]["muted_proc"], depletion["totals"]["depleted_node"]) == (9, 800)
    assert (throttling["peak_throttle_ms"], throttling["most_throttled_client_id"]) == \
        (600, "greedy")
    assert control["peak_control_requests"] == 150
    assert control["leaders"]["control_client"][0]["key"] == "admin"
    stricter = aggregate.incidents(events, per_second, aggregate.Thresholds(
        rejected_per_second=14, throttled_ms=1000, control_requests_per_second=200)).collect()
    assert [row["start"] - T0 for row in stricter] == [30]
    # Existing clients: served in the quiet seconds before and during the incident.
    hurt = [(row["incident"], row["client_id"], row["before_requests"], row["before_p99_ms"],
             row["during_requests"], row["during_p99_ms"])
            for row in aggregate.impact(events, table).collect()]
    assert hurt == [(1, "mouse", 20, bucket_upper(fast) / 1000, 5, bucket_upper(slow) / 1000)]


def test_the_denied_requests_table_says_who_was_refused_what(spark, tmp_path):
    directory = write(tmp_path, [
        denial(1, "User:mallory", "payments", 40, ip="10.6.6.6"),
        denial(2, "User:mallory", "payments", 2, ip="10.6.6.7"),
        denial(2, "User:alice", "orders", 3, api="Fetch", operation="READ"),
    ])
    found = aggregate.denied(load_events(spark, [directory]).events).collect()
    assert [(row["principal"], row["api"], row["resource"], row["operation"], row["denials"],
             row["ips"], row["first_second"] - T0, row["last_second"] - T0) for row in found] == [
        ("User:mallory", "Produce", "payments", "WRITE", 42, 2, 1, 2),
        ("User:alice", "Fetch", "orders", "READ", 3, 1, 2, 2)]


def rebalance(second, group, reason, members=1, group_type="classic"):
    return ev.GroupRebalance(ts=at(second), group=group, group_type=group_type, epoch=second,
                             members=members, reason=reason)


def deliveries(second, group, partition, **counts):
    return ev.ShareDeliveries(ts=at(second), second=T0 + second, group=group, topic="jobs",
                              partition=partition, **counts)


def test_groups_rank_rebalances_and_redeliveries_with_totals_over_every_group(spark, tmp_path):
    directory = write(tmp_path, [
        *[rebalance(s, "orders", "member joined", members=s + 1) for s in range(3)],
        *[rebalance(s, "orders", "session expired") for s in (3, 4)],
        rebalance(5, "orders", "members did not sync in time"), rebalance(6, "orders", "member left"),
        rebalance(1, "billing", "member joined", group_type="consumer"),
        rebalance(2, "billing", "topics changed", members=2, group_type="consumer"),
        deliveries(1, "jobs", 0, acquired=10, redelivered=2, accepted=7, released=1, rejected=1,
                   lock_expired=1),
        deliveries(2, "jobs", 0, acquired=4, redelivered=3, accepted=3, delivery_limit=1),
        deliveries(2, "jobs", 1, acquired=6, accepted=6),
        deliveries(3, "quiet", 0, acquired=100, accepted=100),  # the lightest: not listed
    ])
    found = [row.asDict(recursive=True) for row in
             aggregate.groups(load_events(spark, [directory]).events, n=3).collect()]
    assert [(row["rank"], row["group"], row["group_type"], row["rebalances"],
             row["most_members"]) for row in found] == [
        (1, "orders", "classic", 7, 3), (2, "jobs", "share", None, None),
        (3, "billing", "consumer", 2, 2)]
    orders, jobs, billing = found
    assert [(item["reason"], item["count"]) for item in orders["reasons"]] == [
        ("member joined", 3), ("session expired", 2), ("member left", 1)]  # ties: by name
    assert orders["reason_kinds"] == 4 and orders["acquired"] is None
    assert [jobs[key] for key in aggregate.DELIVERIES] == [20, 5, 16, 1, 1, 1, 1]
    assert (jobs["share_partitions"], jobs["first_second"] - T0, jobs["last_second"] - T0) == \
        (2, 1, 2)
    assert [(item["reason"], item["count"]) for item in billing["reasons"]] == [
        ("member joined", 1), ("topics changed", 1)]
    assert all(row["groups"] == 4 for row in found)  # the totals count every group
    assert orders["types"] == {"classic": 1, "consumer": 1, "share": 2}
    assert orders["totals"] == {"rebalances": 9, "acquired": 120, "redelivered": 5,
                                "accepted": 116, "released": 1, "rejected": 1,
                                "lock_expired": 1, "delivery_limit": 1}


def test_jains_index_per_window(spark, tmp_path):
    directory = write(tmp_path, [
        requests(1, "a", 10, {1: 10}), requests(5, "b", 10, {1: 10}),  # window 0: equal
        requests(12, "a", 30, {1: 30}), requests(15, "b", 10, {1: 10}),  # window 10: 30 v 10
        requests(21, "a", 7, {1: 7}),  # window 20: one client
    ])
    found = aggregate.fairness(load_events(spark, [directory]).events, window=10).collect()
    assert [(row["window_start"] - T0, row["clients"], row["requests"]) for row in found] == \
        [(0, 2, 20), (10, 2, 40), (20, 1, 7)]
    assert [round(row["jain_index"], 6) for row in found] == [1.0, 0.8, 1.0]


def test_garbage_and_unknown_versions_are_counted_and_skipped(spark, tmp_path):
    good = msgspec.json.encode(accepted(0))
    future = json.loads(good)
    future["v"] = 2
    unknown_type = dict(json.loads(good), type="telepathy")
    directory = write(tmp_path, [
        accepted(0), good[:25], b"not json at all", b'{"type": "connection_accepted", "v": 1, '
        b'"ts": "yesterday"}', json.dumps(future).encode(), json.dumps(unknown_type).encode(),
        accepted(1), ev.ConnectionAccepted(ts=5, listener="X", ip="1.2.3.4", port=1, conn_id=1),
    ])
    loaded = load_events(spark, [directory])
    # Unreadable: cut short, not JSON, a time that is text, a time in 1970.
    assert (loaded.lines, loaded.bad_lines, loaded.unknown_version) == (8, 4, 2)
    assert loaded.events.count() == 2
    # A log with nothing readable still makes (empty) tables, not an error.
    nothing = loaded.events.where("false")
    assert aggregate.incidents(nothing, aggregate.timeline(nothing)).collect() == []


def test_the_job_writes_parquet_a_report_with_plots_and_a_summary(spark, tmp_path, capsys):
    directory = write(tmp_path / "events", [
        accepted(0), *[rejected(1) for _ in range(15)], requests(1, "a", 3, {5: 3}),
        ev.Throttle(ts=at(1), client_id="greedy", quota="producer_byte_rate", throttle_ms=90),
        denial(1, "User:mallory", "payments", 7),
        rebalance(0, "orders", "session expired", members=2),
        deliveries(1, "jobs", 0, acquired=8, redelivered=2, accepted=6, lock_expired=2),
        b"{truncated",
    ])
    out = str(tmp_path / "out")
    summary = run([directory], out, spark=spark)
    for table in ("timeline", "top_n", "incidents", "fairness", "latency_by_plane", "denied",
                  "groups"):
        assert os.path.exists(os.path.join(out, table, "_SUCCESS"))
    assert spark.read.parquet(os.path.join(out, "timeline")).count() == 2
    assert (summary["events"], summary["bad_lines"], summary["incidents"]) == (21, 1, 1)
    with open(os.path.join(out, "summary.json")) as handle:
        assert json.load(handle)["events"] == 21
    with open(summary["report"], encoding="utf-8") as handle:
        page = handle.read()
    assert page.count("src='data:image/png;base64,") == 4
    assert "greedy" in page
    denied_section = page[page.index("<h2>Denied requests</h2>"):]
    assert "User:mallory" in denied_section and "payments" in denied_section
    groups_section = page[page.index("<h2>Groups</h2>"):page.index("<h2>Top IPs")]
    assert "<td>session expired (1)</td>" in groups_section
    assert "<td>6 accepted and 2 lock expired</td>" in groups_section
    printed = capsys.readouterr().out
    assert "heaviest group: jobs (share: 2 of 8 records redelivered)" in printed
    assert "Share groups acquired 8 records, 2 of them redelivered (25 %); acquisitions " \
        "ended 6 accepted and 2 lock expired." in printed
    assert "1 unreadable" in printed and "most throttled client: greedy" in printed
    assert "most denied principal: User:mallory (7 requests)" in printed


class SparkDaemon:
    """A Spark standalone master or worker JVM on 127.0.0.1, from pyspark's own scripts."""

    def __init__(self, *args):
        import subprocess
        import sys
        import threading

        import pyspark

        home = os.path.dirname(pyspark.__file__)
        self.env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
                        PYSPARK_PYTHON=sys.executable, SPARK_DAEMON_JAVA_OPTS=TEST_JVM_OPTIONS,
                        PYSPARK_SUBMIT_ARGS=submit_args(executors=True))
        self.proc = subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args],
                                     env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except Exception:  # noqa: BLE001 - a JVM that ignores SIGTERM is killed
            self.proc.kill()
            self.proc.wait()


@pytest.mark.long  # a minute of JVMs: `make compat`, with the other systems run beside ours
def test_the_same_job_runs_unchanged_on_a_standalone_cluster(spark, tmp_path):
    """--master spark://...: a real master and worker (separate JVMs, executors in their own
    processes); the answer is the one local mode gives."""
    import subprocess
    import sys

    from tests.harness import wait_until
    from tests.helpers import free_port

    directory = write(tmp_path / "events", [
        accepted(0), *[rejected(1, ip="10.6.6.6") for _ in range(12)],
        requests(1, "a", 3, {5: 3}), b"garbage"])
    port = free_port()
    master = SparkDaemon("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(free_port()))
    worker = SparkDaemon("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                         "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                         "--webui-port", str(free_port()))
    try:
        # The local run, while the master and the worker start.
        local = run([directory], str(tmp_path / "local"), spark=spark)
        wait_until(lambda: worker.said("Successfully registered with master"), timeout=60)
        # The local run's tables are the baseline: the cluster's figures are the same.
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", "--events", directory, "--out",
             str(tmp_path / "cluster"), "--master", f"spark://127.0.0.1:{port}",
             "--baseline", str(tmp_path / "local"), "--progress-seconds", "1"],
            env=master.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "pipeline " in done.stderr and "computing incidents" in done.stderr
        assert re.search(r"read 15 lines, 1 unreadable.*: [\d,]+ events/s", done.stderr)
        assert "Against the baseline (" in done.stdout and \
            "this run's figures are about the same" in done.stdout
        assert master.said("Registering app pybroker-incidents")
        wait_until(lambda: worker.said("Asked to launch executor"), timeout=10)
    finally:
        worker.stop()
        master.stop()
    with open(tmp_path / "cluster" / "summary.json") as handle:
        remote = json.load(handle)
    for key in ("lines", "events", "bad_lines", "incidents", "seconds", "data_p99_ms"):
        assert remote[key] == local[key], key
    with open(remote["report"], encoding="utf-8") as handle:
        page = handle.read()
    compared = page[page.index("<h2>Compared with the baseline</h2>"):page.index("<h2>Over")]
    assert "connections refused</td><td class='n'>12</td><td class='n'>12</td>" in compared
