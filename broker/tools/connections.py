"""`python -m broker connections`: who is connected to a running broker, busiest first.

It reads the broker's `/connections` endpoint (beside `/metrics` on `prometheus.listen`, found
in the same --config/--override the broker was started with, or given with --url) and prints
one line per connection; --json prints the endpoint's answer as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

from broker.shared.config import ConfigError, load_config, parse_overrides, read_properties_file
from broker.shared.ipc import CONNECTION_SORT_KEYS

COLUMNS = (("WORKER", 8), ("LISTENER", 10), ("CLIENT", 21), ("CLIENT-ID", 20),
           ("PRINCIPAL", 16), ("AGE", 7), ("IN", 8), ("OUT", 8), ("REQS", 8), ("INFL", 4),
           ("THROTTLED", 9), ("NOT READ FOR", 0))


def _arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m broker connections",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", metavar="FILE", help="the broker's .properties file")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--url", help="the endpoint, e.g. http://127.0.0.1:9404/connections")
    parser.add_argument("--top", type=int, default=20, help="how many (1..1000)")
    parser.add_argument("--by", choices=CONNECTION_SORT_KEYS, default="bytes")
    parser.add_argument("--json", action="store_true", help="print the raw JSON answer")
    return parser.parse_args(argv)


def _endpoint(args) -> str:
    if args.url:
        return args.url
    raw = read_properties_file(args.config) if args.config else {}
    raw.update(parse_overrides(args.override))
    address = load_config(raw).prometheus
    if address is None:
        raise ConfigError("prometheus.listen is not set: the broker serves no /connections")
    host, port = address
    host = "127.0.0.1" if host in ("", "0.0.0.0") else host
    return f"http://{host}:{port}/connections"


def _amount(count: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(int(count))


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def _line(values) -> str:
    return " ".join(f"{value:<{width}}" if width else value
                    for value, (_, width) in zip(values, COLUMNS))


def render(answer: dict) -> str:
    """The answer as a table a person reads: one line per connection, then the totals."""
    lines = [_line([name for name, _ in COLUMNS])]
    for row in answer["rows"]:
        lines.append(_line([
            row["worker"], row["listener"], f"{row['ip']}:{row['port']}",
            (row["client_id"] or "-")[:20], row["principal"][:16], _age(row["age_s"]),
            _amount(row["bytes_in"]), _amount(row["bytes_out"]), _amount(row["requests"]),
            str(row["in_flight"]), f"{row['throttle_ms'] / 1000:.1f}s",
            ", ".join(row["waiting_for"]) or "-"]))
    workers = ", ".join(f"{name} {count}" for name, count in answer["workers"].items())
    lines.append(f"{answer['connections']} connections ({workers}); top {answer['top']} by "
                 f"{answer['by']}")
    if answer["unanswered"]:
        lines.append(f"no answer in time from: {', '.join(answer['unanswered'])}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    try:
        url = f"{_endpoint(args)}?top={args.top}&by={args.by}"
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:  # 400 (a bad argument), 503 (busy)
        print(f"{url}: {error.code} {error.read().decode(errors='replace').strip()}",
              file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"{url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=1) if args.json else render(answer))
    return 0
