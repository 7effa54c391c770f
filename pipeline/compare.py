"""Two runs side by side: the key figures of a run from its result tables, an earlier run's
tables read back from its --out directory (`--baseline DIR`), and the figures compared.

The figures come from plain rows, the same function for this run and the baseline, so both are
measured alike; a table the baseline lacks (an older pipeline) leaves its figures blank.
"""

from __future__ import annotations

import os

from pipeline import words

# The timeline's columns the comparison needs: a long baseline is read narrow.
TIMELINE_COLUMNS = ("second", "rejected", "pool_depleted_ms", "muted", "throttle_ms",
                    "data_p99_ms")
MINUS = "\u2212"
NOTABLE_CHANGE = 0.1  # a figure that moved less is left to the table
TABLES = ("timeline", "incidents", "latency_by_plane", "impact")

# (key, what it is, how to write it); lower is better for every one of them.
FIGURES = (
    ("seconds", "time covered", words.seconds),
    ("incidents", "incidents", words.count),
    ("incident_seconds", "time in incidents", words.seconds),
    ("refused", "connections refused", words.count),
    ("peak_refused", "most refused in a second", words.count),
    ("depleted_ms", "memory pool exhausted", words.duration),
    ("muted", "memory mutes", words.count),
    ("throttle_ms", "delay handed to throttled clients", words.duration),
    ("data_p99_ms", "data-plane p99 latency", words.duration),
    ("control_p99_ms", "control-plane p99 latency", words.duration),
    ("worst_existing_p99_ms", "worst existing client's p99 in an incident", words.duration),
)


class BaselineError(Exception):
    pass


def load_run(spark, out: str) -> dict[str, list[dict]]:
    """An earlier run's result tables (Parquet under `out`) as rows; missing ones are empty."""
    from pyspark.errors import AnalysisException

    tables = {}
    for name in TABLES:
        try:
            frame = spark.read.parquet(os.path.join(out, name))
        except AnalysisException:  # not there: a table a later pipeline added
            tables[name] = None
            continue
        if name == "timeline":
            frame = frame.select(*[c for c in TIMELINE_COLUMNS if c in frame.columns])
        tables[name] = [row.asDict(recursive=True) for row in frame.collect()]
    if not tables["timeline"]:
        raise BaselineError(f"--baseline {out}: no result tables there (the --out directory "
                            "of an earlier run of the pipeline)")
    tables["timeline"].sort(key=lambda row: row["second"])
    return tables


def figures(tables: dict, limits: dict) -> dict:
    """The key figures of one run, its incidents judged by `limits` (this run's, for both
    runs: measured alike); None where its tables cannot tell."""
    timeline = tables.get("timeline") or []
    incidents = tables.get("incidents")
    latency = {row["plane"]: row for row in tables.get("latency_by_plane") or []}
    found = {"first": timeline[0]["second"] if timeline else None,
             "last": timeline[-1]["second"] if timeline else None,
             "seconds": len(timeline),
             "incidents": None if incidents is None else len(incidents),
             "incident_seconds": None if incidents is None else
             sum(row["seconds"] for row in incidents),
             "data_p99_ms": latency.get("data", {}).get("p99_ms"),
             "control_p99_ms": latency.get("control", {}).get("p99_ms"),
             "worst_existing_p99_ms": _worst_existing_p99(tables, limits)}
    for key, column in (("refused", "rejected"), ("depleted_ms", "pool_depleted_ms"),
                        ("muted", "muted"), ("throttle_ms", "throttle_ms")):
        known = bool(timeline) and column in timeline[0]  # an older timeline may lack it
        found[key] = sum(row[column] or 0 for row in timeline) if known else None
    found["peak_refused"] = max((row.get("rejected") or 0 for row in timeline), default=None)
    return found


def _worst_existing_p99(tables: dict, limits: dict) -> float | None:
    """The highest p99 a client already there had during an incident, its culprits aside."""
    impact = tables.get("impact")
    if impact is None:
        return None
    culprits = {story.number: story.culprits for story in
                (words.story(row, [], limits) for row in tables.get("incidents") or [])}
    return max((row["during_p99_ms"] for row in impact
                if row["client_id"] not in culprits.get(row["incident"], ())), default=None)


def change(now, before) -> str:
    """How a figure moved: "+33 %", "−12 %", "same", "new" (from zero)."""
    if words.missing(now) or words.missing(before):
        return ""
    if now == before:
        return "same"
    if not before:
        return "new"
    ratio = now / before - 1
    if abs(ratio) < 0.005:
        return "same"
    if ratio >= 9.5:
        return f"\u00d7{now / before:,.0f}"
    return f"{'+' if ratio > 0 else MINUS}{abs(ratio) * 100:.0f} %"


def rows(current: dict, baseline: dict) -> list[tuple[str, str, str, str]]:
    """(figure, this run, baseline, change) for the side-by-side table."""
    table = [("events from", _when(current), _when(baseline), "")]
    for key, label, write in FIGURES:
        now, before = current.get(key), baseline.get(key)
        if now is None and before is None:
            continue
        table.append((label, _write(write, now), _write(write, before), change(now, before)))
    return table


def sentence(current: dict, baseline: dict) -> str:
    """One sentence: what got worse or better against the baseline, by a tenth or more (the
    table has every figure)."""
    moved = []
    for key, label, write in FIGURES[1:]:
        now, before = current.get(key), baseline.get(key)
        if words.missing(now) or words.missing(before) or write(now) == write(before):
            continue  # the same once rounded for people: no news
        if before and abs(now / before - 1) < NOTABLE_CHANGE:
            continue
        moved.append(f"{label} {write(now)} against {write(before)}")
    where = f"Against the baseline ({_when(baseline)})"
    if not moved:
        return f"{where}, this run's figures are about the same."
    return f"{where}: {words.listing(moved[:4])}" + (
        f", and {words.plural(len(moved) - 4, 'other change')} below." if len(moved) > 4
        else ".")


def _when(found: dict) -> str:
    if found.get("first") is None:
        return "no events"
    return (f"{words.clock(found['first'])}{words.DASH}{words.clock(found['last'])} UTC, "
            f"{words.day(found['first'])}")


def _write(write, value) -> str:
    return "\u2014" if words.missing(value) else write(value)
