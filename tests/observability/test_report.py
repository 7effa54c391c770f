"""The incident report as a person reads it: sentences written from hand-made rows (fast, no
Spark), the side-by-side comparison with a baseline, the page in a real headless Chromium, and
the demo incident on a real broker told in sentences, with the job's progress on stderr."""

import os
import re
import shutil
import time
from dataclasses import asdict

import pytest

from pipeline import compare, words
from pipeline.aggregate import Thresholds
from pipeline.report import Report, page, terminal_summary, write_html

T0 = 1_790_000_000  # an epoch second: 2026-09-21 14:13:20 UTC
LIMITS = asdict(Thresholds())  # the job's defaults: 10 refused/s, 500 ms depleted, ...
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package (make chromium)


def lead(*pairs):
    return [{"key": key, "value": float(value)} for key, value in pairs]


def incident(number=1, start=T0 + 10, end=T0 + 14, **fields):
    """An incidents row as pipeline.aggregate.incidents writes it: quiet unless told."""
    row = {"incident": number, "start": start, "end": end, "seconds": end - start + 1,
           "peak_rejected_per_s": 0, "peak_blocked_ratio": 0.0, "peak_depleted_ms": 0.0,
           "peak_throttled_clients": 0, "peak_throttle_ms": 0, "peak_control_requests": 0,
           "totals": {}, "leaders": {}, "denied_requests": 0, "most_denied_principal": None,
           "most_denied_resource": None}
    row.update(fields)
    return row


def impact(number, client, before_ms, during_ms):
    return {"incident": number, "client_id": client, "before_requests": 50,
            "before_p99_ms": before_ms, "during_requests": 40, "during_p99_ms": during_ms}


STORM = incident(
    peak_rejected_per_s=49,
    totals={"rejected_reason": 230.0, "rejected_ip": 230.0, "blocked_reason": 2100.0},
    leaders={"rejected_ip": lead(("10.6.6.6", 200), ("10.6.6.7", 30)),
             "rejected_reason": lead(("per_ip_limit", 200), ("per_ip_rate", 30)),
             "blocked_reason": lead(("connection_limit", 2100))})


# --- numbers and sentences, no Spark ---------------------------------------------------------

def test_numbers_are_rounded_for_people():
    assert words.duration(999.816) == "1.0 s"
    assert [words.duration(ms) for ms in (0.16, 7.168, 16.384, 4323, 125_000, 7_200_000)] == \
        ["0.16 ms", "7.2 ms", "16 ms", "4.3 s", "2 min 5 s", "2 h"]
    assert words.count(12300.0) == "12,300" and words.count(None) == "\u2014"
    assert words.size(857_878_318) == "818 MiB" and words.size(116) == "116 B"
    assert words.percent(0.5) == "50 %" and words.percent(0.001) == "under 1 %"
    assert words.span(T0 + 10, T0 + 14) == "14:13:30\u201314:13:34 UTC (5 s)"
    assert words.plural(1, "connection") == "1 connection"


def test_a_storm_is_told_with_its_addresses_reasons_and_the_clients_it_spared():
    told = words.story(STORM, [impact(1, "steady", 2.0, 2.4), impact(1, "other", 1.0, 1.1)],
                       LIMITS)
    assert told.title == "Connection storm from 10.6.6.6 (200) and 10.6.6.7 (30)"
    assert told.when == "14:13:30\u201314:13:34 UTC (5 s)"
    assert told.causes == ("A connection storm from 10.6.6.6 (200) and 10.6.6.7 (30): up to "
                           "49 connections a second were refused.",)
    assert told.action == ("The broker refused 230 connections (200 over the per-IP "
                           "connection limit and 30 over the per-IP connection rate) and "
                           "stopped accepting for 2.1 s in all (the connection limit was "
                           "reached).")
    assert told.existing == ("Existing clients were not hurt: steady's p99 latency was 2.4 ms "
                             "during, against 2.0 ms before (the most slowed of 2 existing "
                             "clients).")


def test_a_storm_of_one_principal_is_named_by_it():
    row = incident(peak_rejected_per_s=20, totals={"rejected_reason": 40.0},
                   leaders={"rejected_ip": lead(("10.0.0.9", 40)),
                            "rejected_principal": lead(("User:svc", 40)),
                            "rejected_reason": lead(("per_user_limit", 40))})
    told = words.story(row, [], LIMITS)
    assert told.title == "Connection storm from 10.0.0.9 as User:svc"
    assert "40 over the per-user connection limit" in told.action
    assert told.existing.startswith("No client was served both before and during it")


def test_a_memory_burst_names_its_client_and_does_not_count_it_as_a_victim():
    row = incident(peak_depleted_ms=1000.11,
                   totals={"depleted_node": 2223.4, "muted_proc": 606.0,
                           "client_bytes": 6.3e8},
                   leaders={"client_bytes": lead(("flood", 6.3e8), ("steady", 1e4))})
    told = words.story(row, [impact(1, "flood", 1.0, 400.0), impact(1, "steady", 2.0, 60.0),
                             impact(1, "quiet", 2.0, 2.0)], LIMITS)
    assert told.title == "Memory burst from flood"
    assert told.causes == ("A memory burst: large requests (most from client flood) filled "
                           "the request memory pool, which was exhausted for 100 % of the "
                           "worst second.",)
    assert told.action == ("The broker muted connections 606 times until memory was freed "
                           "(the pool was exhausted for 2.2 s in all).")
    assert told.existing == ("Existing clients were hurt: steady's p99 latency rose from "
                             "2.0 ms before to 60 ms during; 1 other existing client did not "
                             "get slower.")


def test_throttling_and_control_plane_load_name_their_clients():
    row = incident(peak_throttle_ms=1015, peak_control_requests=450,
                   totals={"throttled_client": 4323.0, "control_client": 1800.0},
                   leaders={"throttled_client": lead(("greedy", 4000), ("meek", 323)),
                            "throttle_quota": lead(("producer_byte_rate", 4323)),
                            "control_client": lead(("admin-tool", 1700), ("steady", 100))})
    told = words.story(row, [impact(1, "steady", 1.0, 3.0), impact(1, "greedy", 1.0, 90.0)],
                       LIMITS)
    assert told.title == "Throttled client greedy; Control-plane load from admin-tool"
    assert told.causes == (
        "A throttled client: greedy (and 1 other client) went over its produce byte-rate "
        "quota.",
        "Control-plane load: up to 450 requests a second on the control plane, most from "
        "client admin-tool.")
    assert told.action == ("The broker throttled 2 clients for 4.3 s in all, greedy most "
                           "(4.0 s).")
    assert told.existing == ("Existing clients were slowed a little: steady's p99 latency "
                             "rose from 1.0 ms before to 3.0 ms during.")
    # Only the leaders are kept; `keys` says how many there were.
    many = words.story(dict(row, keys={"throttled_client": 500}), [], LIMITS)
    assert "greedy (and 499 other clients) went over" in many.causes[0]
    assert many.action.startswith("The broker throttled 500 clients for 4.3 s in all")


def test_the_run_is_summed_up_in_a_sentence_or_two():
    timeline = [{"second": T0 + s} for s in range(25)]
    summary = {"brokers": 1, "lines": 1000, "bad_lines": 3, "unknown_version": 0,
               "data_requests": 839, "data_p99_ms": 16.384, "control_requests": 11,
               "control_p99_ms": 8.192}
    told = [words.story(STORM, [], LIMITS)]
    assert words.lede(summary, timeline, told) == (
        "1 incident in 25 s of events from 1 broker (14:13:20\u201314:13:44 UTC, 21 Sep 2026).")
    assert words.lede(summary, timeline, []).startswith("No incidents in 25 s of events")
    assert words.overall(summary, [{"metric": "shadow_rejections", "rank": 1,
                                    "key": "10.0.0.8", "value": 2.0}]) == [
        "Over the whole run the data plane served 839 requests with a p99 latency of 16 ms "
        "and the control plane served 11 requests with a p99 latency of 8.2 ms.",
        "3 of 1,000 lines in the event log could not be used (3 unreadable, 0 of an unknown "
        "version) and were skipped.",
        "Limits in shadow mode would have refused 10.0.0.8 most (2 connections); nothing of "
        "that was enforced."]


TOTALS = {"rebalances": 9, "acquired": 120, "redelivered": 5, "accepted": 116, "released": 1,
          "rejected": 1, "lock_expired": 1, "delivery_limit": 1}
TYPES = {"classic": 1, "consumer": 1, "share": 2}


def group(rank, name, group_type, rebalances=None, reasons=(), reason_kinds=0, members=None,
          **delivered):
    """A groups row as pipeline.aggregate.groups writes it: the totals over every group."""
    counts = {key: delivered.get(key, 0) if delivered else None for key in TOTALS
              if key != "rebalances"}
    return {"rank": rank, "group": name, "group_type": group_type, "rebalances": rebalances,
            "most_members": members, "reason_kinds": reason_kinds,
            "reasons": [{"reason": reason, "count": n} for reason, n in reasons] or None,
            **counts, "groups": 4, "types": TYPES, "totals": TOTALS}


GROUPS = [group(1, "orders", "classic", 7, (("member joined", 3), ("session expired", 2),
                                             ("member left", 1)), reason_kinds=4, members=3),
          group(2, "jobs", "share", acquired=20, redelivered=5, accepted=16, released=1,
                rejected=1, lock_expired=1, delivery_limit=1),
          group(3, "billing", "consumer", 2, (("member joined", 1), ("topics changed", 1)),
                reason_kinds=2, members=2)]


def test_groups_are_told_with_their_rebalances_reasons_and_redeliveries():
    assert words.groups(GROUPS) == [
        "4 groups in the event log (1 classic, 1 consumer and 2 share), the 3 with the most "
        "rebalances and redeliveries listed.",
        "Groups rebalanced 9 times in all.",
        "Share groups acquired 120 records, 5 of them redelivered (4 %); acquisitions ended "
        "116 accepted, 1 released, 1 rejected, 1 lock expired and 1 archived at the delivery "
        "limit."]
    assert words.reasons(GROUPS[0]) == ("member joined (3), session expired (2), member left "
                                        "(1) and 1 other reason")
    assert words.reasons(GROUPS[1]) == "" and words.endings(GROUPS[0]) == ""
    assert words.heaviest(GROUPS[0]) == "orders (classic: 7 rebalances)"
    assert words.heaviest(GROUPS[1]) == "jobs (share: 5 of 20 records redelivered)"
    # Every group listed, none a share group: no word of what the table already shows.
    alone = [dict(GROUPS[0], groups=1, types={"classic": 1},
                  totals=dict.fromkeys(TOTALS, 0) | {"rebalances": 7})]
    assert words.groups(alone) == ["1 group in the event log (1 classic).",
                                   "Groups rebalanced 7 times in all."]
    assert words.groups([]) == []


def test_the_groups_section_lists_the_heaviest_above_the_totals():
    html = page(Report(_summary(), dict(_tables(), groups=GROUPS), LIMITS))
    section = html[html.index("<h2>Groups</h2>"):html.index("<h2>Top IPs")]
    assert "4 groups in the event log (1 classic, 1 consumer and 2 share)" in section
    rows = re.findall(r"<tr>(.*?)</tr>", section)
    cells = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in rows]
    assert cells[0] == ["#", "group", "type", "rebalances", "most members",
                        "most common reasons", "acquired", "redelivered",
                        "how acquisitions ended"]
    assert cells[1] == ["1", "orders", "classic", "7", "3", "member joined (3), session "
                        "expired (2), member left (1) and 1 other reason", "\u2014", "\u2014",
                        "\u2014"]
    assert cells[2] == ["2", "jobs", "share", "\u2014", "\u2014", "\u2014", "20", "5",
                        "16 accepted, 1 released, 1 rejected, 1 lock expired and 1 archived "
                        "at the delivery limit"]
    assert cells[4][:4] == ["", "all 4 groups", "", "9"] and cells[4][6:8] == ["120", "5"]
    assert "<h2>Groups</h2>" not in page(Report(_summary(), _tables(), LIMITS))
    told = terminal_summary(Report(_summary(), dict(_tables(), groups=GROUPS), LIMITS))
    assert "heaviest group: orders (classic: 7 rebalances)\n4 groups in the event log" in told


def test_a_baseline_is_compared_figure_by_figure():
    def run(first, refused, p99, incidents, impacts=None):
        return {"timeline": [{"second": first + s, "rejected": refused if s == 3 else 0,
                              "pool_depleted_ms": 0.0, "throttle_ms": 0, "muted": 0,
                              "data_p99_ms": 1.0} for s in range(20)],
                "incidents": [incident(n + 1, peak_depleted_ms=900.0, leaders={
                    "client_bytes": lead(("flood", 1e9))}) for n in range(incidents)],
                "latency_by_plane": [{"plane": "data", "requests": 10, "p50_ms": 1.0,
                                      "p99_ms": p99}],
                "impact": impacts}

    # The flood caused the burst: its own p99 is not an existing client's.
    now = compare.figures(run(T0, 230, 16.384, 2, [impact(1, "flood", 5.0, 80.0),
                                                   impact(1, "steady", 1.0, 3.0)]), LIMITS)
    before = compare.figures(run(T0 - 600, 100, 16.4, 1), LIMITS)  # an older run: no impact
    table = {label: (this, base, moved) for label, this, base, moved in
             compare.rows(now, before)}
    assert table["connections refused"] == ("230", "100", "+130 %")
    assert table["incidents"] == ("2", "1", "+100 %")
    assert table["data-plane p99 latency"] == ("16 ms", "16 ms", "same")
    assert table["events from"] == ("14:13:20\u201314:13:39 UTC, 21 Sep 2026",
                                    "14:03:20\u201314:03:39 UTC, 21 Sep 2026", "")
    assert table["worst existing client's p99 in an incident"] == ("3.0 ms", "\u2014", "")
    assert compare.sentence(now, before) == (
        "Against the baseline (14:03:20\u201314:03:39 UTC, 21 Sep 2026): incidents 2 against 1, "
        "time in incidents 10 s against 5 s, connections refused 230 against 100 and most "
        "refused in a second 230 against 100.")
    assert compare.change(0, 0) == "same" and compare.change(5, 0) == "new"
    assert compare.change(90, 100) == "\u221210 %" and compare.change(2000, 100) == "\u00d720"


def test_the_page_opens_with_what_happened_before_any_plot_or_table():
    report = Report(_summary(), _tables(), LIMITS)
    html = page(report)
    told = html.index("<h2>What happened</h2>")
    assert told < html.index("<img") and told < html.index("<table")
    assert html.count("src='data:image/png;base64,") == 4
    assert "Connection storm from 10.6.6.6 (200) and 10.6.6.7 (30)" in html
    assert "999.816" not in html and "12300" not in html
    baseline = page(Report(_summary(), _tables(), LIMITS, baseline=_tables()))
    assert baseline.index("<h2>Compared with the baseline</h2>") < baseline.index("<img")


# --- a real browser --------------------------------------------------------------------------

def look_at(path: str, width: int = 1280) -> dict:
    """Open the report in headless Chromium: its layout's width, its screenshots, whether its
    images decoded, and where "What happened" sits."""
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "Chromium is needed: `make chromium` installs it"
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM)
        try:
            view = browser.new_page(viewport={"width": width, "height": 800})
            view.goto("file://" + os.path.abspath(path), wait_until="load")
            seen = {
                "scroll_width": view.evaluate("document.documentElement.scrollWidth"),
                "images_decoded": view.evaluate(
                    "[...document.images].map(i => i.complete && i.naturalWidth > 0)"),
                "told_top": view.locator("#what-happened").bounding_box()["y"],
                "told": view.inner_text("#what-happened"),
                "first_screen": view.screenshot(),
                "whole_page": view.screenshot(full_page=True),
            }
        finally:
            browser.close()
    return seen


def assert_readable(seen: dict, images: int) -> None:
    for shot in (seen["first_screen"], seen["whole_page"]):
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    assert seen["scroll_width"] <= 1280, "the report is wider than the window"
    assert seen["images_decoded"] == [True] * images
    assert seen["told_top"] < 300  # the sentences are on the first screen


@pytest.mark.system  # starts Chromium
def test_a_report_with_long_names_and_a_baseline_fits_a_1280_px_window(tmp_path):
    path = str(tmp_path / "report.html")
    write_html(path, Report(_summary(), _tables(long_names=True), LIMITS,
                            baseline=_tables()))
    seen = look_at(path)
    assert_readable(seen, images=5)
    assert "Compared with the baseline" not in seen["told"]
    assert "Connection storm from" in seen["told"]


def _summary() -> dict:
    return {"lines": 12_300, "events": 12_300, "bad_lines": 0, "unknown_version": 0,
            "seconds": 30, "incidents": 1, "brokers": 1, "data_requests": 839,
            "data_p50_ms": 1.0, "data_p99_ms": 16.384, "job_seconds": 20.5}


def _tables(long_names: bool = False) -> dict:
    """A run's rows by hand: one storm; with `long_names`, names no table can fit whole."""
    name = ("client-" + "x" * 180) if long_names else "steady"
    timeline = [{"second": T0 + s, "accepted": 5, "rejected": 49 if 10 <= s <= 14 else 0,
                 "active": 12, "pool_depleted_ms": 999.816 if s == 20 else 0.0,
                 "acceptor_blocked_ratio": 0.0, "muted": 0, "throttle_ms": 0,
                 "throttled_clients": 0, "data_requests": 12_300, "data_p50_ms": 1.0,
                 "data_p99_ms": 16.384, "control_requests": 1, "control_p50_ms": 0.1,
                 "control_p99_ms": 0.2} for s in range(30)]
    top = [{"dimension": dimension, "key": f"{name}-{rank}", "metric": metric,
            "value": 12_300.0 / rank, "rank": rank}
           for dimension, metric in (("client_id", "bytes"), ("client_id", "requests"),
                                     ("ip", "rejections"), ("client_id", "throttle_ms"),
                                     ("principal", "denials"))
           for rank in range(1, 11)]
    denied = [{"principal": f"User:{name}", "api": "Produce", "resource_type": "TOPIC",
               "resource": name, "operation": "WRITE", "denials": 12_300, "ips": 2,
               "first_second": T0, "last_second": T0 + 29}]
    groups = [dict(row, group=f"{name}-{row['group']}") for row in GROUPS] if long_names else []
    return {"timeline": timeline, "incidents": [STORM], "top_n": top, "denied": denied,
            "groups": groups,
            "impact": [impact(1, name, 2.0, 2.4)],
            "fairness": [{"window_start": T0 + w, "clients": 3, "requests": 12_300,
                          "jain_index": 0.7} for w in (0, 10, 20)],
            "latency_by_plane": [{"plane": "data", "requests": 839, "p50_ms": 1.0,
                                  "p99_ms": 16.384}]}


# --- the demo incident on a real broker ------------------------------------------------------

@pytest.mark.system
def test_the_demo_incident_is_told_in_sentences_on_the_first_screen(spark, tmp_path, capfd):
    from loadtest import demo
    from pipeline.job import run
    from tests.harness import BrokerProcess

    with BrokerProcess(workers=2, overrides=demo.OVERRIDES, data_dir=str(tmp_path)) as broker:
        played = demo.play(broker, demo.Phases(storm_waves=2, greedy_seconds=2.5,
                                               flood_seconds=2.0, quiet_seconds=3.0))
    assert played["steady_error"] is None and played["flood"]["answered"] > 0
    capfd.readouterr()
    started = time.monotonic()
    summary = run([str(tmp_path / "pybroker-events")], str(tmp_path / "report"), spark=spark,
                  progress_interval=0.5)
    took = time.monotonic() - started
    printed = capfd.readouterr()

    storm, greedy, burst = _told(summary, played)
    assert storm["title"] == f"Connection storm from {demo.STORM_SOURCE}"
    assert "over the per-IP connection limit" in storm["sentences"][1]
    assert greedy["title"] == "Throttled client greedy"
    assert "greedy went over its produce byte-rate quota" in greedy["sentences"][0]
    assert burst["title"] == "Memory burst from flood"
    assert "(most from client flood)" in burst["sentences"][0]
    assert "muted connections" in burst["sentences"][1]
    for told in (storm, greedy, burst):  # the steady client was served before each
        assert re.match(r"Existing clients (were not hurt|were slowed a little|were hurt): "
                        r"steady's p99 latency", told["sentences"][-1]), told

    seen = look_at(summary["report"])
    assert_readable(seen, images=4)
    for told in (storm, greedy, burst):
        assert f"{told['incident']}. {told['title']} {told['when']}" in seen["told"]
        for sentence in told["sentences"]:
            assert sentence in seen["told"]
    _assert_progress(printed.err, took)


def _told(summary: dict, played: dict) -> list[dict]:
    """The report's three incidents, each at the wall-clock time its part was played."""
    found = summary["what_happened"]
    assert len(found) == 3, [told["title"] for told in found]
    for told, part in zip(found, ("storm", "greedy", "flood")):
        begun, ended = played[f"{part}_span"]
        # Per-second events: the incident's seconds are within its part's, give or take a
        # second (and one more at the end: a pool still draining after the flood stopped).
        assert int(begun) - 1 <= told["start"] <= told["end"] <= int(ended) + 2, (part, told)
    return found


def _assert_progress(stderr: str, took: float) -> None:
    """Each step named, the rate said, Spark's stages while they run: at most a line per
    step or said figure, and one per poll (0.5 s)."""
    lines = [line for line in stderr.splitlines() if line.startswith("pipeline ")]
    said = "\n".join(lines)
    for step in ("reading event files", "computing timeline", "computing incidents",
                 "writing the report"):
        assert step in said, said
    assert re.search(r"read [\d,]+ lines, 0 unreadable.*: [\d,]+ events/s", said), said
    assert re.search(r"Spark (stage \d+|stages \d+, \d+|\d+ stages \(\d+\u2013\d+\)): "
                     r"\d+/\d+ tasks done", said), said
    assert re.search(r"done: [\d,]+ events in [\d.]+ s", said), said
    polled = [line for line in lines if ": Spark " in line]
    assert len(lines) - len(polled) == 12  # 10 steps, the lines read and the end
    assert len(polled) <= took / 0.5 + 1
