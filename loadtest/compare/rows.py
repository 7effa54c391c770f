"""A comparison's rows: what a scenario measures (Row: name, unit, which way is better), what
each broker gave (Reading: a figure or none, with a note), and the two joined into the
scenario record the table and the JSON show:
{name, unit, ours, kafka, ratio, better, notes}."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadtest.compare.brokers import SIDES, failure, on_each

BETTER = ("higher", "lower")


@dataclass(frozen=True)
class Row:
    name: str
    unit: str
    better: str
    notes: str = ""

    def __post_init__(self):
        if self.better not in BETTER:
            raise ValueError(f"{self.name}: better must be one of {BETTER}, not {self.better!r}")
        if not self.name or not self.unit:
            raise ValueError("a row needs a name and a unit")


@dataclass(frozen=True)
class Reading:
    """One broker's figure for a row (None: not measured, `note` says why)."""

    value: float | None
    note: str = ""

    def __post_init__(self):
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"a reading is a finite number or None, not {self.value!r}")


def attempt(readings: dict[str, Reading], names, measure) -> None:
    """Adds `measure()`'s readings ({name: Reading}) to `readings`; if it raises, each of
    `names` gets no figure and the reason."""
    try:
        readings.update(measure())
    except Exception as error:  # noqa: BLE001 - reported in the table, never invented
        reason = failure(error)
        readings.update({name: Reading(None, reason) for name in names})


def ratio(ours: float | None, kafka: float | None) -> float | None:
    if ours is None or kafka is None or kafka == 0 or ours < 0 or kafka < 0:
        return None
    return ours / kafka


def measure_both(rows: list[Row], measure, overrides: dict[str, str] | None = None,
                 into: dict[str, dict[str, Reading]] | None = None) -> dict[str, dict]:
    """`measure(broker)`'s readings on each side (brokers.on_each), added to `into`; a side
    whose broker or measurement failed has no figure for any of `rows`, and the reason."""
    into = into if into is not None else {side: {} for side in SIDES}
    for side, found in on_each(measure, overrides).items():
        if isinstance(found, str):
            found = {row.name: Reading(None, f"not measured: {found}") for row in rows}
        into.setdefault(side, {}).update(found)
    return into


def join(rows: list[Row], results: dict[str, dict[str, Reading]]) -> list[dict]:
    """The scenario records of `rows`, from each side's readings."""
    records = []
    for row in rows:
        values, notes = {}, [row.notes] if row.notes else []
        for side in SIDES:
            reading = results.get(side, {}).get(row.name, Reading(None, "not measured"))
            values[side] = reading.value
            if reading.note:
                notes.append(f"{'ours' if side == 'ours' else 'Kafka'}: {reading.note}")
        records.append({"name": row.name, "unit": row.unit, "ours": values["ours"],
                        "kafka": values["kafka"], "ratio": ratio(values["ours"], values["kafka"]),
                        "better": row.better, "notes": "; ".join(notes)})
    return records
