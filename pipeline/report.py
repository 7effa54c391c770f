"""The report for a person: one self-contained HTML file, and a short terminal summary.

The first screen says in sentences what happened (pipeline.words: each incident's time, cause,
what the broker did, whether existing clients were hurt); then, with --baseline, this run and
an earlier one side by side (pipeline.compare); then the plots (pipeline.plots, PNGs embedded
as base64); then the tables, every one narrow enough for the page, numbers rounded for people.
"Groups" (only when the log holds group events) lists the heaviest groups: type, rebalances,
their most common reasons, and a share group's records acquired, redelivered and how the
acquisitions ended, above a row of totals over every group.
Works on plain rows (dicts) collected from the small result tables.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from pipeline import compare, plots, words

CSS = """
body{margin:0;background:#f6f6f6;color:#222;font:15px/1.5 system-ui,-apple-system,"Segoe UI",
Roboto,"DejaVu Sans",sans-serif}
main{max-width:1200px;margin:0 auto;padding:20px 28px 40px;box-sizing:border-box;
overflow-wrap:anywhere}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:20px;margin:36px 0 10px;padding-bottom:4px;border-bottom:1px solid #ddd}
h3{font-size:16px;margin:0 0 4px}
.lede{font-size:17px;margin:4px 0 12px}
.incident{background:#fff;border-left:4px solid #d62728;padding:10px 16px;margin:12px 0}
.incident .when{color:#555;font-weight:normal;white-space:nowrap}
.incident p{margin:2px 0}
.quiet{border-left-color:#2ca02c}
figure{margin:14px 0;background:#fff;padding:8px}
img{display:block;max-width:100%;height:auto}
table{border-collapse:collapse;background:#fff;font-size:14px;max-width:100%}
table.wide{width:100%}
th,td{padding:4px 10px;border-bottom:1px solid #e4e4e4;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
th{background:#eee;font-weight:600}
.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.k{min-width:5.5em}
.cards{display:flex;flex-wrap:wrap;gap:16px}
.card{flex:1 1 300px;min-width:0}
.card h3{font-size:14px}
.card table{width:100%}
.note{color:#555;font-size:14px}
.details th{width:30%;background:none;font-weight:normal;color:#555}
"""

TOLD = 12  # incidents told in sentences; the table lists them all
LATENCY_NOTE = ("Latencies are the broker's own measure, from reading a request to answering "
                "it: time a client waited before its request was read (muted while memory "
                "was short, or throttled) is not in them.")
TOP_TITLES = {
    ("ip", "rejections"): "IPs by refused connections",
    ("principal", "rejections"): "Principals by refused connections",
    ("ip", "connections"): "IPs by accepted connections",
    ("ip", "bytes"): "IPs by bytes in and out",
    ("client_id", "bytes"): "Clients by bytes in and out",
    ("client_id", "requests"): "Clients by requests",
    ("client_id", "connections"): "Clients by connections",
    ("client_id", "throttle_ms"): "Clients by throttle time",
    ("user", "throttle_ms"): "Users by throttle time",
    ("principal", "connections"): "Principals by connections",
    ("principal", "denials"): "Principals by requests denied",
    ("ip", "authentication_failures"): "IPs by failed authentications",
    ("principal", "transactional_id_refusals"): "Principals refused transactional ids",
    ("ip", "transactional_id_refusals"): "IPs refused transactional ids",
    ("user", "authentication_failures"): "User names by failed authentications",
    ("ip", "shadow_rejections"): "IPs shadow mode would have refused",
    ("client_id", "shadow_throttle_ms"): "Clients shadow mode would have throttled",
}
KEY_HEADINGS = {"ip": "IP", "client_id": "client id", "user": "user", "principal": "principal"}
METRIC_WORDS = {"bytes": ("bytes", words.size), "throttle_ms": ("delay", words.duration),
                "shadow_throttle_ms": ("delay", words.duration)}


@dataclass
class Report:
    """Everything the page shows: the run's summary and rows, the thresholds, a baseline."""
    summary: dict
    tables: dict[str, list[dict]]
    limits: dict
    window: int = 10
    baseline: dict | None = None  # compare.load_run's tables of an earlier run
    stories: list = field(init=False)  # pipeline.words.Story per incident

    def __post_init__(self):
        impact = self.tables.get("impact") or []
        self.stories = [words.story(row, impact, self.limits)
                        for row in self.tables.get("incidents") or []]


def write_html(path: str, report: Report) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page(report))


def page(report: Report) -> str:
    tables = report.tables
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>Broker incident report</title><style>{CSS}</style></head><body><main>",
        "<h1>Broker incident report</h1>",
        _what_happened(report),
    ]
    if report.baseline is not None:
        parts.append(_comparison(report))
    parts += [_plots(report), _incident_table(report), _denied(tables.get("denied") or []),
              _groups(tables.get("groups") or []), _top(tables.get("top_n") or []),
              _fairness(tables.get("fairness") or [], report.window),
              _details(report), "</main></body></html>"]
    return "\n".join(parts)


# --- sections --------------------------------------------------------------------------------

def _what_happened(report: Report) -> str:
    lede = words.lede(report.summary, report.tables["timeline"], report.stories)
    parts = [f"<p class='lede'>{_e(lede)}</p>",
             "<section id='what-happened'><h2>What happened</h2>"]
    for story in report.stories[:TOLD]:
        parts.append(
            f"<article class='incident' id='incident-{story.number}'><h3>{story.number}. "
            f"{_e(story.title)} <span class='when'>{_e(story.when)}</span></h3>"
            f"<p>{_e(' '.join(story.causes))}</p><p>{_e(story.action)}</p>"
            f"<p>{_e(story.existing)}</p></article>")
    if len(report.stories) > TOLD:
        parts.append(f"<p>{_e(words.plural(len(report.stories) - TOLD, 'more incident'))} "
                     "in the incidents table below.</p>")
    if not report.stories:
        parts.append("<article class='incident quiet'><p>No connection storm, memory burst, "
                     "throttling or control-plane load passed its threshold.</p></article>")
    for sentence in words.overall(report.summary, report.tables.get("top_n") or []):
        parts.append(f"<p>{_e(sentence)}</p>")
    if report.stories:
        parts.append(f"<p class='note'>{_e(LATENCY_NOTE)}</p>")
    parts.append("</section>")
    return "\n".join(parts)


def _comparison(report: Report) -> str:
    current = compare.figures(report.tables, report.limits)
    baseline = compare.figures(report.baseline, report.limits)
    rows = compare.rows(current, baseline)
    body = "".join(f"<tr><td>{_e(label)}</td><td class='n'>{_e(now)}</td>"
                   f"<td class='n'>{_e(before)}</td><td class='n'>{_e(moved)}</td></tr>"
                   for label, now, before, moved in rows)
    png = plots.comparison(report.tables["timeline"], report.baseline["timeline"])
    return ("<section id='baseline'><h2>Compared with the baseline</h2>"
            f"<p>{_e(compare.sentence(current, baseline))}</p>"
            "<table><tr><th>figure</th><th class='n'>this run</th><th class='n'>baseline</th>"
            f"<th class='n'>change</th></tr>{body}</table>"
            f"<figure><img alt='This run against the baseline' "
            f"src='data:image/png;base64,{png}'></figure></section>")


def _plots(report: Report) -> str:
    figures = plots.figures(report.tables["timeline"], report.tables.get("fairness") or [],
                            report.tables.get("incidents") or [], report.window)
    parts = ["<section id='plots'><h2>Over time</h2>",
             "<p class='note'>Wall-clock time, UTC; incidents are shaded and numbered.</p>"]
    for title, png in figures.items():
        parts.append(f"<figure><img alt='{_e(title)}' src='data:image/png;base64,{png}'>"
                     "</figure>")
    parts.append("</section>")
    return "\n".join(parts)


def _incident_table(report: Report) -> str:
    rows = []
    for story, row in zip(report.stories, report.tables.get("incidents") or []):
        rows.append([story.number, story.when, story.title,
                     words.count(words.total(row, "rejected_reason")),
                     words.duration(words.total(row, "depleted_node")),
                     words.count(words.total(row, "muted_proc")),
                     words.duration(words.total(row, "throttled_client")),
                     words.count(row.get("denied_requests") or 0)])
    return _section("Incidents", _table(
        ["#", "when", "cause", "refused", "pool exhausted", "mutes", "throttled", "denied"],
        rows, numeric={0, 3, 4, 5, 6, 7}))


def _denied(rows: list[dict]) -> str:
    cells = [[row["principal"], row["api"], f"{row['resource_type']} {row['resource']}",
              row["operation"], words.count(row["denials"]), words.count(row["ips"]),
              f"{words.clock(row['first_second'])}{words.DASH}"
              f"{words.clock(row['last_second'])}"] for row in rows]
    return _section("Denied requests", _table(
        ["principal", "API", "resource", "operation", "denied", "IPs", "when (UTC)"], cells,
        numeric={4, 5}))


def _groups(rows: list[dict]) -> str:
    """The heaviest groups and a row of totals over every group; nothing without groups."""
    if not rows:
        return ""
    cells = [[row["rank"], row["group"], row["group_type"], words.count(row["rebalances"]),
              words.count(row["most_members"]), words.reasons(row) or "\u2014",
              words.count(row["acquired"]), words.count(row["redelivered"]),
              words.endings(row) or "\u2014"] for row in rows]
    totals = rows[0]["totals"]
    # Without a share group the share columns' totals are not 0 but not applicable.
    share = bool((rows[0].get("types") or {}).get("share"))
    cells.append(["", f"all {words.plural(rows[0]['groups'], 'group')}", "",
                  words.count(totals["rebalances"]), "", "",
                  words.count(totals["acquired"] if share else None),
                  words.count(totals["redelivered"] if share else None),
                  words.endings(totals) or "\u2014"])
    sentences = "".join(f"<p>{_e(sentence)}</p>" for sentence in words.groups(rows))
    return _section("Groups", sentences + _table(
        ["#", "group", "type", "rebalances", "most members", "most common reasons",
         "acquired", "redelivered", "how acquisitions ended"], cells,
        numeric={0, 3, 4, 6, 7}, names={1, 2}))


def _top(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dimension"], row["metric"]), []).append(row)
    order = [key for key in TOP_TITLES if key in groups]
    order += sorted(key for key in groups if key not in TOP_TITLES)
    cards = []
    for key in order:
        dimension, metric = key
        heading, write = METRIC_WORDS.get(metric, (metric.replace("_", " "), words.count))
        title = TOP_TITLES.get(key, f"{dimension} by {metric}".replace("_", " "))
        cells = [[row["rank"], row["key"], write(row["value"])]
                 for row in sorted(groups[key], key=lambda row: row["rank"])]
        cards.append(f"<div class='card'><h3>{_e(title)}</h3>"
                     + _table(["#", KEY_HEADINGS.get(dimension, dimension), heading], cells,
                              numeric={0, 2}) + "</div>")
    body = f"<div class='cards'>{''.join(cards)}</div>" if cards else "<p>none</p>"
    return _section("Top IPs, clients and principals", body)


def _fairness(rows: list[dict], window: int) -> str:
    cells = [[f"{words.clock(row['window_start'])}{words.DASH}"
              f"{words.clock(row['window_start'] + window - 1)}", words.count(row["clients"]),
              words.count(row["requests"]), f"{row['jain_index']:.2f}"] for row in rows]
    return _section(f"Fairness between clients, per {window} s", _table(
        ["window (UTC)", "clients", "requests", "Jain's index"], cells, numeric={1, 2, 3}))


def _details(report: Report) -> str:
    summary, limits = report.summary, report.limits
    items = [
        ("event lines read", words.count(summary.get("lines"))),
        ("events used", words.count(summary.get("events"))),
        ("unreadable lines", words.count(summary.get("bad_lines"))),
        ("lines of an unknown version", words.count(summary.get("unknown_version"))),
        ("brokers", words.count(summary.get("brokers"))),
        ("seconds covered", words.count(summary.get("seconds"))),
        ("an incident is a second with", "; ".join([
            f"{words.count(limits['rejected_per_second'])} or more connections refused",
            f"the acceptor blocked {words.percent(limits['blocked_ratio'])} of it or more",
            f"the memory pool exhausted {words.duration(limits['depleted_ms'])} or more",
            f"{words.duration(limits['throttled_ms'])} or more of throttle delay",
            f"{words.count(limits['control_requests_per_second'])} or more control-plane "
            "requests"])),
        ("seconds joined across", words.seconds(limits["gap_seconds"]) + " of quiet"),
        ("job time", words.duration((summary.get("job_seconds") or 0) * 1000)),
    ]
    rows = "".join(f"<tr><th scope='row'>{_e(key)}</th><td>{_e(value)}</td></tr>"
                   for key, value in items)
    return _section("Run details", f"<table class='wide details'>{rows}</table>")


# --- pieces ----------------------------------------------------------------------------------

def _e(text) -> str:
    return html.escape(str(text))


def _section(title: str, body: str) -> str:
    return f"<h2>{_e(title)}</h2>\n{body}"


def _table(columns: list[str], rows: list[list], numeric: set[int] = frozenset(),
           names: set[int] = frozenset()) -> str:
    """`numeric` columns align right; `names` columns keep a short name on one line beside
    long text (a long name still wraps)."""
    if not rows:
        return "<p>none</p>"

    def cell(tag, index, value):
        kind = " class='n'" if index in numeric else " class='k'" if index in names else ""
        return f"<{tag}{kind}>{_e(value)}</{tag}>"

    head = "<tr>" + "".join(cell("th", i, c) for i, c in enumerate(columns)) + "</tr>"
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table class='wide'>{head}{body}</table>"


# --- the terminal ----------------------------------------------------------------------------

def terminal_summary(report: Report) -> str:
    summary, top = report.summary, report.tables.get("top_n") or []
    lines = [f"events: {summary['events']:,} valid of {summary['lines']:,} lines "
             f"({summary['bad_lines']:,} unreadable, {summary['unknown_version']:,} unknown "
             f"version skipped); {summary['seconds']:,} seconds covered",
             words.lede(summary, report.tables["timeline"], report.stories)]
    for story in report.stories[:5]:
        lines.append(f"incident {story.number}, {story.when}: {story.title}. "
                     + " ".join(story.sentences))
    if len(report.stories) > 5:
        lines.append(f"... and {words.plural(len(report.stories) - 5, 'more incident')}")
    for metric, what, write in (("denials", "most denied principal",
                                 lambda v: words.plural(v, "request")),
                                ("throttle_ms", "most throttled client", words.duration)):
        leader = [row for row in top if row["metric"] == metric and row["rank"] == 1]
        if leader:
            lines.append(f"{what}: {leader[0]['key']} ({write(leader[0]['value'])})")
    lines += words.overall(summary, top)
    groups = report.tables.get("groups") or []
    if groups:
        lines.append(f"heaviest group: {words.heaviest(groups[0])}")
    lines += words.groups(groups)
    if report.baseline is not None:
        lines.append(compare.sentence(compare.figures(report.tables, report.limits),
                                      compare.figures(report.baseline, report.limits)))
    return "\n".join(lines)
