"""The comparison as a printed table of ratios (ours / Kafka's, and which broker each row
favours) with numbered notes, and as JSON with the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from loadtest.apache_kafka import VERSION


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def verdict(record: dict) -> str:
    """Which broker the row favours, and by how much."""
    ratio = record["ratio"]
    if ratio is None:
        return "not comparable"
    if ratio == 0:
        return "ours better" if record["better"] == "lower" else "Kafka better"
    ahead = ratio if record["better"] == "higher" else 1 / ratio
    if 0.95 <= ahead <= 1.05:
        return "even"
    return f"ours {ahead:.2f}x better" if ahead > 1 else f"Kafka {1 / ahead:.2f}x better"


def render(records: list[dict], notes: list[str]) -> str:
    width = max([len(record["name"]) for record in records] + [20])
    lines = [f"{'scenario':{width}} {'unit':>17} {'ours':>9} {'Kafka':>9} {'ours/Kafka':>10} "
             f"{'better':>6}  verdict"]
    footnotes: dict[str, int] = {}  # a note shared by rows is printed once
    for record in records:
        ratio = "-" if record["ratio"] is None else f"{record['ratio']:.2f}"
        mark = ""
        if record["notes"]:
            number = footnotes.setdefault(record["notes"], len(footnotes) + 1)
            mark = f" [{number}]"
        lines.append(f"{record['name']:{width}} {record['unit']:>17} {_figure(record['ours']):>9} "
                     f"{_figure(record['kafka']):>9} {ratio:>10} {record['better']:>6}  "
                     f"{verdict(record)}{mark}")
    lines.append("")
    lines += [f"  {note}" for note in notes]
    lines += [f"  [{number}] {text}" for text, number in footnotes.items()]
    return "\n".join(lines)


def _java_version() -> str:
    try:
        result = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        return (result.stderr or result.stdout).splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def machine() -> dict:
    """What the figures depend on besides the brokers."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo
                          if line.startswith("model name")), model)
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(memory / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "java": _java_version(), "kafka": VERSION, "load_average": os.getloadavg()}


def save(path: str, records: list[dict], notes: list[str], started: float, elapsed: float,
         argv: list[str], load_at_start: tuple) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    document = {"command": " ".join([os.path.basename(sys.executable), "-m", "loadtest.compare",
                                     *argv]),
                "machine": dict(machine(), load_average_at_start=load_at_start),
                "started": started, "elapsed_seconds": round(elapsed, 1), "notes": notes,
                "scenarios": records}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1)
        out.write("\n")
