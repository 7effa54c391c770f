"""deploy/ against the real tools: promtool checks and unit-tests the
alert rules; a real Prometheus scrapes a real broker with the shipped scrape config and rules
(their `for:` shortened), and must see the broker's series, counters summed over both
workers, and an alert fired by a provoked rejection storm; the Grafana dashboard's queries
must name only metrics the broker exports and be accepted by Prometheus."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from tests.harness import PROJECT, BrokerProcess, wait_until
from tests.helpers import free_port
from tests.admission.helpers import served_probes
from tests.wire import KafkaSocket, api_versions_request

ROOT = Path(PROJECT)
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "pybroker.json"
PROMTOOL = "/usr/bin/promtool"
PROMETHEUS = "/usr/bin/prometheus"

# The storm comes from an address of its own, limited to HELD connections, so nothing else
# the tests do from 127.0.0.1 counts against the limit.
LIMITED = "127.0.0.5"
HELD = 2


def alert_names(rules_text: str) -> list[str]:
    return re.findall(r"^\s*- alert:\s*(\S+)\s*$", rules_text, re.MULTILINE)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


# --- promtool ----------------------------------------------------------------------------------

@pytest.mark.system
def test_promtool_accepts_the_rules_and_the_scrape_config():
    alerts = alert_names(RULES.read_text())
    assert len(alerts) >= 9 and len(set(alerts)) == len(alerts), alerts
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    records = re.findall(r"^\s*- record:", RULES.read_text(), re.MULTILINE)
    assert f"SUCCESS: {len(alerts) + len(records)} rules found" in checked.stdout, checked.stdout
    config = promtool("check", "config", str(SCRAPE_CONFIG))  # loads rules.yml beside it
    assert config.returncode == 0, config.stdout + config.stderr


@pytest.mark.system
def test_promtool_unit_tests_pass_and_cover_every_alert_both_ways():
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # Every `alertname:` line of rules_test.yml is followed by its `exp_alerts:`: `[]` is a
    # case where the alert must not fire, a list of alerts one where it must.
    lines = RULES_TEST.read_text().splitlines()
    fires, silent = set(), set()
    for number, line in enumerate(lines):
        if match := re.match(r"\s*alertname:\s*(\S+)\s*$", line):
            expected = lines[number + 1].strip()
            assert expected.startswith("exp_alerts:"), (number, line, expected)
            (silent if expected == "exp_alerts: []" else fires).add(match.group(1))
    alerts = set(alert_names(RULES.read_text()))
    assert alerts - fires == set(), "alerts with no case where they fire"
    assert alerts - silent == set(), "alerts with no case where they stay silent"
    assert (fires | silent) - alerts == set(), "cases of alerts that do not exist"


# --- the dashboard, without a broker ---------------------------------------------------------

# Words of PromQL that look like metric names once label lists, matchers and ranges are gone.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (function and aggregation names, label
    names and values, durations, numbers and Grafana variables are not)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group().lower() in _KEYWORDS:
            continue  # a function or an aggregation, or an operator
        names.add(match.group())
    return names


def test_metric_names_come_out_of_promql_and_nothing_else():
    assert metric_names(
        'histogram_quantile(0.99, sum by (api, le) (rate(broker_request_duration_seconds_bucket'
        '{instance="$instance", listener=~"A|B{2}"}[$__rate_interval])))'
    ) == {"broker_request_duration_seconds_bucket"}
    assert metric_names(
        'sum without (worker) (rate(a_total[5m] offset 1h)) / on (instance) group_left (scope)'
        ' b{c="d}e"} > bool 1e3 or c unless d and topk(10, e:recorded)'
    ) == {"a_total", "b", "c", "d", "e:recorded"}
    assert metric_names("sum(rate(x_total[1m])) by (le) * 100") == {"x_total"}
    assert metric_names('vector(1) + scalar(broker_up)') == {"broker_up"}


def dashboard_panels() -> list[dict]:
    """Every panel, rows' collapsed panels included."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard_panels() for target in panel.get("targets", [])]


def test_dashboard_panels_have_a_datasource_a_unit_and_legends():
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    graphs = [panel for panel in dashboard_panels() if panel["type"] != "row"]
    assert len(graphs) >= 15
    ids = [panel["id"] for panel in dashboard_panels()]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert panel.get("description"), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["legendFormat"] and target["expr"], panel["title"]
            # Every query follows the broker picked at the top of the dashboard.
            for selector in re.findall(r"\b(broker_\w+)(\{[^}]*\})?", target["expr"]):
                assert 'instance="$instance"' in selector[1], (panel["title"], selector)


# --- a broker scraped by a real Prometheus ---------------------------------------------------

class PrometheusServer:
    """/usr/bin/prometheus on 127.0.0.1 with a config and rules written to `workdir`; only the
    process started here is ever signalled, by its pid."""

    def __init__(self, workdir: str, config: str, rules: str):
        self.workdir = workdir
        Path(workdir, "prometheus.yml").write_text(config)
        Path(workdir, "rules.yml").write_text(rules)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 20.0) -> "PrometheusServer":
        # A port picked free may be taken before Prometheus binds it: then try another one.
        for _attempt in range(3):
            self.port = free_port()
            log = open(Path(self.workdir, "prometheus.log"), "w")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.workdir}/prometheus.yml",
                 f"--storage.tsdb.path={self.workdir}/data",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
            log.close()
            try:
                state = wait_until(self._ready_or_exited, timeout, interval=0.1)
            except AssertionError:
                raise AssertionError(f"prometheus not ready within {timeout}s:\n{self.log()}") \
                    from None
            if state is True:
                return self
            self.proc.wait()
            if "address already in use" not in self.log():
                break
        raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")

    def _ready_or_exited(self):
        if self.proc.poll() is not None:
            return "exited"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return Path(self.workdir, "prometheus.log").read_text()[-4000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str):
        """The `data` of a successful API answer; an error answer raises with its message."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as error:  # a bad query is a 400 with a JSON body
            body = json.load(error)
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, None while it has no result."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None


def shortened_rules() -> str:
    """rules.yml with every `for:` set to 0s: an alert fires at the first evaluation its
    expression holds.  The expressions are what is tested here, against real data; their
    durations are tested by promtool (rules_test.yml)."""
    text, count = re.subn(r"^(\s+)for:\s*\S+\s*$", r"\1for: 0s", RULES.read_text(),
                          flags=re.MULTILINE)
    assert count >= 5
    return text


def scrape_config(target: str) -> str:
    """The shipped deploy/prometheus/prometheus.yml, scraping and evaluating every second
    and pointed at the test's broker."""
    text = SCRAPE_CONFIG.read_text()
    for old, new in ((r"scrape_interval: \S+", "scrape_interval: 1s\n  scrape_timeout: 1s"),
                     (r"evaluation_interval: \S+", "evaluation_interval: 1s"),
                     (r'"127\.0\.0\.1:9404"', f'"{target}"')):
        text, count = re.subn(old, new, text)
        assert count == 1, (old, text)
    return text


@pytest.fixture(scope="module")
def stack():
    """One broker (two workers, the memory pool on so its metrics exist, LIMITED held to HELD
    connections) and one Prometheus scraping it, shared by the tests below."""
    # Prometheus applies new scrape targets about 5s after it starts: started first, on the
    # broker's metrics port picked in advance, it waits while the broker starts.
    metrics = f"127.0.0.1:{free_port()}"
    overrides = {"queued.max.request.bytes": str(200 << 20),
                 "max.connections.per.ip.overrides": f"{LIMITED}:{HELD}",
                 "prometheus.listen": metrics}
    with tempfile.TemporaryDirectory(prefix="pybroker-prometheus-") as workdir:
        prometheus = PrometheusServer(workdir, scrape_config(metrics), shortened_rules())
        try:
            prometheus.start()
            with BrokerProcess(workers=2, overrides=overrides) as broker:
                assert instance(broker) == metrics
                wait_until(lambda: prometheus.value('up{job="pybroker"}') == 1, 15,
                           interval=0.2, message="Prometheus never scraped the broker")
                yield broker, prometheus
        finally:
            prometheus.stop()


def instance(broker: BrokerProcess) -> str:
    host, port = broker.metrics_address
    return f"{host}:{port}"


def sample_names(exposition: str) -> set[str]:
    return {re.match(r"[A-Za-z_:][\w:]*", line).group()
            for line in exposition.splitlines() if line and not line.startswith("#")}


def exported_names(exposition: str) -> set[str]:
    """Every name Prometheus stores from this exposition: the samples, and each family's
    names even while it has no sample (broker_quota_rate with no quota set)."""
    names = sample_names(exposition)
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE):
        if kind == "histogram":
            names |= {f"{family}_bucket", f"{family}_count", f"{family}_sum"}
        elif kind == "counter":
            names.add(family if family.endswith("_total") else f"{family}_total")
        else:
            names.add(family)
    return names


def socket_owner(client: socket.socket, server: tuple[str, int], pids: dict[str, int]) -> str:
    """The worker whose process holds the broker's end of `client`'s TCP connection, found
    through /proc/net/tcp (the socket's inode) and each worker's descriptors."""
    def address(text: str) -> tuple[str, int]:
        ip, port = text.split(":")
        return socket.inet_ntoa(struct.pack("<I", int(ip, 16))), int(port, 16)

    peer = client.getsockname()
    with open("/proc/net/tcp", encoding="ascii") as table:
        inodes = [fields[9] for fields in (line.split() for line in list(table)[1:])
                  if address(fields[1]) == server and address(fields[2]) == peer]
    assert len(inodes) == 1, (peer, inodes)
    wanted = f"socket:[{inodes[0]}]"
    owners = [name for name, pid in pids.items()
              if any(os.readlink(f"/proc/{pid}/fd/{fd}") == wanted
                     for fd in os.listdir(f"/proc/{pid}/fd"))]
    assert len(owners) == 1, (peer, owners)
    return owners[0]


@pytest.mark.system
def test_the_brokers_series_arrive_and_counters_sum_over_both_workers(stack):
    broker, prometheus = stack
    # Every name in the broker's exposition is stored by Prometheus after its next scrapes.
    exposed = sample_names(broker.scrape())
    assert len(exposed) >= 30

    missing = set(exposed)

    def stored():
        names = prometheus.api("label/__name__/values", **{"match[]": '{job="pybroker"}'})
        missing.clear()
        missing.update(exposed - set(names))
        return not missing
    try:
        wait_until(stored, 10, interval=0.2)
    except AssertionError:
        raise AssertionError(f"series never stored by Prometheus: {sorted(missing)}") from None
    workers = prometheus.query('broker_worker_up{job="pybroker"} == 1')
    assert sorted(series["metric"]["worker"] for series in workers) == ["data-0", "data-1"]

    # Known requests over connections the acceptor deals round-robin to both workers.
    connections, requests_each = 8, 5
    before = broker.metric("broker_requests_total", api="ApiVersions", listener="PLAINTEXT")
    clients = [KafkaSocket(broker.listeners["PLAINTEXT"]) for _ in range(connections)]
    try:
        for client in clients:
            for correlation in range(requests_each):
                client.send(api_versions_request(correlation_id=correlation))
                client.receive()
        owners = [socket_owner(client.sock, broker.listeners["PLAINTEXT"], broker.worker_pids)
                  for client in clients]
    finally:
        for client in clients:
            client.close()
    assert sorted(set(owners)) == ["data-0", "data-1"], owners  # both workers counted some
    expected = before + connections * requests_each
    assert broker.metric("broker_requests_total", api="ApiVersions",
                         listener="PLAINTEXT") == expected
    requests = 'sum(broker_requests_total{job="pybroker", api="ApiVersions"})'
    histogram = 'sum(broker_request_duration_seconds_count{job="pybroker", api="ApiVersions"})'
    wait_until(lambda: prometheus.value(requests) == expected, 10, interval=0.2,
               message=f"{requests} never reached {expected}")
    assert prometheus.value(histogram) == expected


@pytest.mark.system
def test_every_dashboard_metric_is_exported_by_the_broker(stack):
    broker, _prometheus = stack
    exported = exported_names(broker.scrape())
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert len(used) >= 25, used
    assert used - exported == set(), "dashboard metrics the broker does not export"


@pytest.mark.system
def test_prometheus_accepts_every_dashboard_query(stack):
    broker, prometheus = stack
    # The broker picked in the dashboard's `instance` variable: its query finds this one.
    found = prometheus.api("label/instance/values", **{"match[]": "broker_worker_up"})
    assert instance(broker) in found
    answered = 0
    for expr in dashboard_exprs():
        concrete = expr.replace("$__rate_interval", "1m").replace("$instance", instance(broker))
        assert "$" not in concrete, expr
        prometheus.query(concrete)  # raises on anything but status "success"
        answered += 1
    assert answered == len(dashboard_exprs()) >= 25
    # And with real data behind them: the workers' panel shows both.
    up = next(expr for expr in dashboard_exprs() if expr.startswith("broker_worker_up"))
    assert len(prometheus.query(up.replace("$instance", instance(broker)))) == 2


def alerts(prometheus: PrometheusServer) -> list[dict]:
    return prometheus.api("alerts")["alerts"]


def rules_evaluated_after(prometheus: PrometheusServer, moment: float) -> bool:
    """Whether every rule ran since `moment` (unix time); a rule in error fails at once."""
    groups = prometheus.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    for rule in rules:
        assert rule["health"] in ("ok", "unknown") and not rule.get("lastError"), rule
    assert len([rule for rule in rules if rule["type"] == "alerting"]) == \
        len(alert_names(RULES.read_text()))
    # Go's RFC 3339 stamps (nanoseconds, any zone) parse as they are; never run is year 1.
    return all(rule["health"] == "ok"
               and datetime.fromisoformat(rule["lastEvaluation"]).timestamp() > moment
               for rule in rules)


@pytest.mark.system
def test_a_rejection_storm_fires_its_alert_and_nothing_else(stack):
    broker, prometheus = stack
    # The rules run on real data without errors, and a quiet broker fires nothing.
    started = time.time()
    wait_until(lambda: rules_evaluated_after(prometheus, started), 10, interval=0.2,
               message="rules were not all evaluated")
    assert alerts(prometheus) == []

    # LIMITED holds its HELD connections; every further one is refused (per_ip_limit).
    refused = ("broker_connections_rejected_total", {"listener": "PLAINTEXT",
                                                     "reason": "per_ip_limit"})
    storm, batch = 80, 20
    holders = served_probes(broker.listeners["PLAINTEXT"], HELD, source=LIMITED)
    try:
        before = broker.metric(refused[0], **refused[1])
        # In batches, so the refused sockets never fill the listen backlog.
        for start in range(0, storm, batch):
            sockets = [socket.create_connection(broker.listeners["PLAINTEXT"], timeout=5,
                                                source_address=(LIMITED, 0))
                       for _ in range(batch)]
            try:
                wait_until(lambda: broker.metric(refused[0], **refused[1])
                           >= before + start + batch, 10,
                           message=f"fewer than {start + batch} of the storm refused")
            finally:
                for sock in sockets:
                    sock.close()
    finally:
        for holder in holders:
            holder.close()

    def firing():
        return [alert for alert in alerts(prometheus) if alert["state"] == "firing"]
    fired = wait_until(firing, 20, interval=0.2, message="no alert fired after the storm")
    assert [alert["labels"] for alert in fired] == [{
        "alertname": "PybrokerConnectionsRejected", "severity": "warning",
        "instance": instance(broker), "job": "pybroker", "listener": "PLAINTEXT",
        "reason": "per_ip_limit"}]
    summary = fired[0]["annotations"]["summary"]
    assert summary == (f"pybroker {instance(broker)}: connections rejected on PLAINTEXT "
                       "(per_ip_limit)")
    assert "connections per second refused on listener PLAINTEXT" in \
        fired[0]["annotations"]["description"]
    # The series behind it: Prometheus sees every refusal (the alert may have fired on a
    # scrape taken before the last batch).
    total = 'sum(broker_connections_rejected_total{job="pybroker", reason="per_ip_limit"})'
    wait_until(lambda: (prometheus.value(total) or 0) >= before + storm, 10, interval=0.2,
               message=f"Prometheus never saw the {storm} refusals")
    assert rules_evaluated_after(prometheus, time.time() - 60)
