"""The operator's report: one self-contained HTML file with matplotlib PNGs embedded, and a
short terminal summary.  Works on rows collected from the small result tables."""

from __future__ import annotations

import base64
import datetime
import html
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG bytes
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

NAN = float("nan")


def _clock(second: int) -> str:
    return datetime.datetime.fromtimestamp(second, datetime.timezone.utc).strftime("%H:%M:%S")


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _series(rows, name, missing=0.0):
    """A column as a list; seconds without a value get `missing` (NaN draws a gap)."""
    return [row[name] if row[name] is not None else missing for row in rows]


def plots(timeline: list, fairness: list) -> dict[str, str]:
    """Title -> base64 PNG."""
    if not timeline:
        return {}
    start = timeline[0]["second"]
    x = [row["second"] - start for row in timeline]
    found = {}
    figure, axis = plt.subplots(figsize=(10, 3.2))
    axis.plot(x, _series(timeline, "accepted"), label="accepted/s")
    axis.plot(x, _series(timeline, "rejected"), label="rejected/s", color="red")
    axis.plot(x, _series(timeline, "active"), label="active", color="gray", linestyle="--")
    axis.set_xlabel(f"seconds since {_clock(start)} UTC")
    axis.legend(loc="upper right")
    found["Connections"] = _png(figure)

    figure, axis = plt.subplots(figsize=(10, 3.2))
    axis.plot(x, _series(timeline, "acceptor_blocked_ratio"), label="acceptor blocked ratio")
    axis.plot(x, [v / 1000 for v in _series(timeline, "pool_depleted_ms")],
              label="pool depleted (s per s)", color="purple")
    axis.set_ylim(0, 1.05)
    axis.set_xlabel(f"seconds since {_clock(start)} UTC")
    axis.legend(loc="upper right")
    found["Acceptor blocking and memory pool depletion"] = _png(figure)

    figure, (rate, latency) = plt.subplots(1, 2, figsize=(12, 3.2))
    for plane, colour in (("data", "tab:blue"), ("control", "tab:green")):
        rate.plot(x, _series(timeline, f"{plane}_requests"), label=f"{plane} plane", color=colour)
        latency.plot(x, _series(timeline, f"{plane}_p99_ms", NAN), label=f"{plane} p99",
                     color=colour, marker=".")
        latency.plot(x, _series(timeline, f"{plane}_p50_ms", NAN), label=f"{plane} p50",
                     color=colour, linestyle=":", marker=".")
    rate.set_title("requests per second")
    latency.set_title("latency, ms (log)")
    latency.set_yscale("symlog", linthresh=0.1)
    for axis in (rate, latency):
        axis.legend(loc="upper right")
    found["Requests by plane"] = _png(figure)

    figure, (throttled, fair) = plt.subplots(1, 2, figsize=(12, 3.2))
    throttled.bar(x, _series(timeline, "throttled_clients"), color="orange")
    throttled.set_title("throttled clients per second")
    if fairness:
        fair.plot([row["window_start"] - start for row in fairness],
                  [row["jain_index"] for row in fairness], marker="o")
    fair.set_ylim(0, 1.05)
    fair.set_title("Jain's fairness index over served requests")
    found["Throttling and fairness"] = _png(figure)
    return found


def _table(rows: list, columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row[c]))}</td>" for c in columns)
                   + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>" if rows else "<p>none</p>"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return "" if value is None else str(value)


def write_html(path: str, summary: dict, timeline: list, incidents: list, top: list,
               fairness: list, denied: list = ()) -> None:
    figures = plots(timeline, fairness)
    incident_rows = [dict(row.asDict(), start=_clock(row["start"]), end=_clock(row["end"]))
                     for row in incidents]
    denied_rows = [dict(row.asDict(), first_second=_clock(row["first_second"]),
                        last_second=_clock(row["last_second"])) for row in denied]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Broker incident report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>",
        "<h1>Broker incident report</h1>",
        _table([summary], list(summary)),
        "<h2>Incidents</h2>",
        _table(incident_rows, ["incident", "start", "end", "seconds", "peak_rejected_per_s",
                               "peak_blocked_ratio", "peak_depleted_ms",
                               "peak_throttled_clients", "top_ip", "top_client_id",
                               "most_throttled_client_id", "denied_requests",
                               "most_denied_principal", "most_denied_resource"]),
        "<h2>Denied requests</h2>",
        _table(denied_rows, ["principal", "api", "resource_type", "resource", "operation",
                             "denials", "ips", "first_second", "last_second"]),
    ]
    for title, png in figures.items():
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' "
                     f"src='data:image/png;base64,{png}'>")
    parts += ["<h2>Top IPs and client ids</h2>",
              _table(top, ["dimension", "metric", "rank", "key", "value"]),
              "<h2>Fairness windows</h2>",
              _table(fairness, ["window_start", "clients", "requests", "jain_index"]),
              "</body></html>"]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))


def terminal_summary(summary: dict, incidents: list, top: list) -> str:
    lines = [f"events: {summary['events']:,} valid of {summary['lines']:,} lines "
             f"({summary['bad_lines']:,} unreadable, {summary['unknown_version']:,} unknown "
             f"version skipped); {summary['seconds']:,} seconds covered"]
    for row in incidents[:5]:
        lines.append(f"incident {row['incident']}: {_clock(row['start'])}-{_clock(row['end'])} UTC "
                     f"({row['seconds']} s), peak {row['peak_rejected_per_s']} rejected/s, "
                     f"blocked {row['peak_blocked_ratio']:.2f}, depleted "
                     f"{row['peak_depleted_ms']:.0f} ms/s; ip {row['top_ip']}, client "
                     f"{row['top_client_id']}, throttled {row['most_throttled_client_id']}")
    if not incidents:
        lines.append("no incidents")
    denied = [row for row in top if row["metric"] == "denials" and row["rank"] == 1]
    if denied:
        lines.append(f"most denied principal: {denied[0]['key']} "
                     f"({denied[0]['value']:,.0f} requests)")
    throttled = [row for row in top if row["metric"] == "throttle_ms" and row["rank"] == 1]
    if throttled:
        lines.append(f"most throttled client: {throttled[0]['key']} "
                     f"({throttled[0]['value']:,.0f} ms)")
    for metric, what, unit in (("shadow_rejections", "would have refused", "connections"),
                               ("shadow_throttle_ms", "would have throttled", "ms")):
        leader = [row for row in top if row["metric"] == metric and row["rank"] == 1]
        if leader:
            lines.append(f"shadow mode {what} {leader[0]['key']} most "
                         f"({leader[0]['value']:,.0f} {unit}; nothing was enforced)")
    for plane in ("data", "control"):
        if summary.get(f"{plane}_p99_ms") is not None:
            lines.append(f"{plane} plane: {summary[f'{plane}_requests']:,} requests, p50 "
                         f"{summary[f'{plane}_p50_ms']:.2f} ms, p99 "
                         f"{summary[f'{plane}_p99_ms']:.2f} ms")
    return "\n".join(lines)
