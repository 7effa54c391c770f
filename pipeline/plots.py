"""The report's plots: matplotlib (Agg, no display) figures as base64 PNGs, in one style, on
wall-clock (UTC) time axes with each incident shaded and numbered.

Works on plain rows (dicts) collected from the result tables.  Each figure is 1200 px wide at
most, the report's column.
"""

from __future__ import annotations

import base64
import datetime
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG bytes
import matplotlib.dates as mdates  # noqa: E402  (after choosing the backend)
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as ticker  # noqa: E402

NAN = float("nan")
UTC = datetime.timezone.utc
WIDTH_IN, HEIGHT_IN, DPI = 12, 3.5, 100
MARKED_POINTS = 600
NUMBERED_INCIDENTS = 40  # more would print over each other: shaded only
TITLE_PAD = 20  # points: room for the legend's row under the title
COLOURS = {"accepted": "#1f77b4", "refused": "#d62728", "active": "#7f7f7f",
           "pool": "#9467bd", "acceptor": "#ff7f0e", "data": "#1f77b4", "control": "#2ca02c",
           "throttle": "#ff7f0e", "fairness": "#17becf", "incident": "#d62728",
           "baseline": "#7f7f7f"}
# ConciseDateFormatter's formats per tick level (years, months, days, hours, minutes,
# seconds): full clock times, and the date once, in the corner.
TICK_FORMATS = ["%Y", "%b", "%d %b", "%H:%M", "%H:%M", "%H:%M:%S"]
ZERO_FORMATS = ["", "%Y", "%b %Y", "%d %b", "%H:%M", "%H:%M:%S"]
OFFSET_FORMATS = ["", "%Y", "%b %Y", "%d %b %Y", "%d %b %Y", "%d %b %Y"]
STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.titleweight": "bold", "axes.titlelocation": "left",
    "axes.labelsize": 10, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 9, "legend.frameon": False,
    "lines.linewidth": 1.6, "figure.dpi": DPI, "savefig.dpi": DPI,
}


def figures(timeline: list[dict], fairness: list[dict], incidents: list[dict],
            window: int) -> dict[str, str]:
    """Title -> base64 PNG: connections, memory pool and acceptor, requests, throttling and
    fairness.  Nothing when there is no timeline."""
    if not timeline:
        return {}
    with plt.rc_context(STYLE):
        return {
            "Connections": _connections(timeline, incidents),
            "Memory pool and acceptor": _pressure(timeline, incidents),
            "Requests by plane": _requests(timeline, incidents),
            "Throttling and fairness": _throttling(timeline, fairness, incidents, window),
        }


def comparison(current: list[dict], baseline: list[dict]) -> str:
    """This run against the baseline, aligned at each run's first second."""
    with plt.rc_context(STYLE):
        figure, (refused, latency) = plt.subplots(1, 2, figsize=(WIDTH_IN, HEIGHT_IN))
        for rows, label, colour, style in ((current, "this run", COLOURS["refused"], "-"),
                                           (baseline, "baseline", COLOURS["baseline"], "--")):
            if not rows:
                continue
            since = [row["second"] - rows[0]["second"] for row in rows]
            refused.plot(since, _series(rows, "rejected"), label=label, color=colour,
                         linestyle=style)
            latency.plot(since, _series(rows, "data_p99_ms", NAN), label=label, color=colour,
                         linestyle=style, marker=_marker(rows))
        _labels(refused, "Connections refused", "per second", "seconds since the run's start")
        _labels(latency, "Data-plane p99 latency", "ms (log scale)",
                "seconds since the run's start")
        _log_scale(latency)
        for axis in (refused, latency):
            _legend(axis)
        return _png(figure)


# --- the four timeline figures ---------------------------------------------------------------

def _connections(timeline, incidents) -> str:
    figure, axis = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN))
    times = _middles(timeline)
    axis.plot(times, _series(timeline, "accepted"), label="accepted", color=COLOURS["accepted"])
    axis.plot(times, _series(timeline, "rejected"), label="refused", color=COLOURS["refused"])
    _labels(axis, "Connections accepted and refused", "connections per second")
    open_now = axis.twinx()
    open_now.plot(times, _series(timeline, "active"), label="open (right axis)",
                  color=COLOURS["active"], linestyle="--")
    open_now.set_ylabel("open connections")
    open_now.set_ylim(bottom=0)
    open_now.grid(False)
    open_now.spines["right"].set_visible(True)
    _legend(axis, open_now)
    _finish(axis, timeline, incidents)
    return _png(figure)


def _pressure(timeline, incidents) -> str:
    figure, axis = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN))
    times = _middles(timeline)
    axis.plot(times, [min(v / 10, 100) for v in _series(timeline, "pool_depleted_ms")],
              label="memory pool exhausted", color=COLOURS["pool"])
    axis.plot(times, [v * 100 for v in _series(timeline, "acceptor_blocked_ratio")],
              label="acceptor blocked", color=COLOURS["acceptor"])
    axis.set_ylim(0, 105)
    _labels(axis, "Memory pool exhaustion and acceptor blocking", "% of each second")
    _legend(axis)
    _finish(axis, timeline, incidents)
    return _png(figure)


def _requests(timeline, incidents) -> str:
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(WIDTH_IN, HEIGHT_IN))
    times = _middles(timeline)
    for plane in ("data", "control"):
        colour = COLOURS[plane]
        rate.plot(times, _series(timeline, f"{plane}_requests"), label=f"{plane} plane",
                  color=colour)
        latency.plot(times, _series(timeline, f"{plane}_p99_ms", NAN), label=f"{plane} p99",
                     color=colour, marker=_marker(timeline))
        latency.plot(times, _series(timeline, f"{plane}_p50_ms", NAN), label=f"{plane} p50",
                     color=colour, linestyle=":", marker=_marker(timeline))
    _labels(rate, "Requests served", "requests per second")
    _labels(latency, "Request latency", "ms (log scale)")
    _log_scale(latency)
    for axis in (rate, latency):
        _legend(axis)
        _finish(axis, timeline, incidents)
    return _png(figure)


def _throttling(timeline, fairness, incidents, window: int) -> str:
    figure, (throttled, fair) = plt.subplots(1, 2, figsize=(WIDTH_IN, HEIGHT_IN))
    times = _times(timeline)
    # One path for all the seconds (stairs, not a bar each): fast for a week of them too.
    edges = times + _times([{"second": timeline[-1]["second"] + 1}])
    throttled.stairs([v / 1000 for v in _series(timeline, "throttle_ms")], edges, fill=True,
                     color=COLOURS["throttle"], label="delay handed to throttled clients")
    _labels(throttled, "Throttling", "seconds of delay per second")
    _legend(throttled)
    first, last = timeline[0]["second"], timeline[-1]["second"] + 1
    for row in fairness:  # each window as a flat segment, cut to the covered time
        begin = max(row["window_start"], first)
        end = min(row["window_start"] + window, last)
        fair.plot(_times([{"second": begin}, {"second": end}]), [row["jain_index"]] * 2,
                  color=COLOURS["fairness"], linewidth=2.5)
    fair.set_ylim(0, 1.05)
    _labels(fair, f"Fairness between clients ({window} s windows)",
            "Jain's index (1 = equal shares)")
    for axis in (throttled, fair):
        _finish(axis, timeline, incidents)
    return _png(figure)


# --- shared pieces ---------------------------------------------------------------------------

def _times(rows, offset: float = 0.0) -> list:
    return [mdates.date2num(datetime.datetime.fromtimestamp(row["second"] + offset, UTC))
            for row in rows]


def _middles(rows) -> list:
    """Per-second values drawn in the middle of the second they describe."""
    return _times(rows, 0.5)


def _series(rows, name, missing=0.0) -> list:
    """A column as a list; seconds without a value get `missing` (NaN draws a gap)."""
    return [row.get(name) if row.get(name) is not None else missing for row in rows]


def _marker(rows) -> str | None:
    """A dot per second shows lone values between gaps; past a few hundred, only clutter."""
    return "." if len(rows) <= MARKED_POINTS else None


def _log_scale(axis) -> None:
    """Log scale labelled 0.5, 1, 2, 5, 10 ... in plain numbers, not powers of ten."""
    axis.set_yscale("log")
    axis.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
    axis.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.yaxis.set_minor_formatter(ticker.NullFormatter())


def _labels(axis, title: str, unit: str, xlabel: str = "time (UTC)") -> None:
    axis.set_title(title, pad=TITLE_PAD)
    axis.set_ylabel(unit)
    axis.set_xlabel(xlabel)


def _legend(*axes) -> None:
    """One legend for the axes given, between the title and the plot: it hides no data and
    no incident number."""
    handles, labels = [], []
    for axis in axes:
        found = axis.get_legend_handles_labels()
        handles += found[0]
        labels += found[1]
    axes[0].legend(handles, labels, loc="lower left", bbox_to_anchor=(0, 1), ncol=len(labels),
                   borderaxespad=0.1, handlelength=1.6, columnspacing=1.2)


def _finish(axis, timeline, incidents) -> None:
    """Wall-clock ticks (the date in the corner), the covered time only, incidents shaded."""
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8, tz=UTC)
    axis.xaxis.set_major_locator(locator)
    axis.xaxis.set_major_formatter(mdates.ConciseDateFormatter(
        locator, tz=UTC, formats=TICK_FORMATS, zero_formats=ZERO_FORMATS,
        offset_formats=OFFSET_FORMATS))
    first, last = _times([timeline[0], {"second": timeline[-1]["second"] + 1}])
    axis.set_xlim(first, last)
    for row in incidents:
        begin, end = _times([{"second": row["start"]}, {"second": row["end"] + 1}])
        axis.axvspan(begin, end, color=COLOURS["incident"], alpha=0.08, linewidth=0)
        if len(incidents) > NUMBERED_INCIDENTS:
            continue
        axis.annotate(str(row["incident"]), xy=(begin, 1), xycoords=("data", "axes fraction"),
                      xytext=(2, -2), textcoords="offset points", va="top",
                      color=COLOURS["incident"], fontsize=9, fontweight="bold")


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
