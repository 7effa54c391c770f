"""`python -m broker [--config FILE] [--override key=value ...]`: start the broker.

`python -m broker connections [...]` lists a running broker's connections instead (see
broker/tools/connections.py).

Exit status: 0 after a clean shutdown, 1 when start-up fails (port in use, data directory
locked), 2 for a configuration error (one line naming the key), 3 when a worker cannot boot.
"""

from __future__ import annotations

import argparse
import logging
import sys

from broker.shared.config import (ConfigError, describe_keys, load_config, parse_overrides,
                                  read_properties_file)
from broker.shared.constants import LOG_FORMAT
from broker.shared.lean_imports import without_test_strategies

EXIT_STARTUP, EXIT_CONFIG = 1, 2


def _arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__.split("\n")[0])
    parser.add_argument("--config", metavar="FILE", help="Kafka .properties file")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="set one key, after the file (repeatable)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--describe-config", action="store_true",
                        help="print every configuration key as a Markdown table and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["connections"]:
        from broker.tools.connections import main as connections

        return connections(argv[1:])
    args = _arguments(argv)
    if args.describe_config:
        print(describe_keys())
        return 0
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    try:
        raw = read_properties_file(args.config) if args.config else {}
        raw.update(parse_overrides(args.override))
        config = load_config(raw)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    def reload() -> dict[str, str]:
        fresh = read_properties_file(args.config) if args.config else {}
        fresh.update(parse_overrides(args.override))
        return fresh

    return _run(config, args.log_level, reload)


def _run(config, log_level: str, reload) -> int:
    import uvloop

    from broker.parent.runtime import Runtime, StartupError
    from broker.parent.supervisor import Supervisor

    log = logging.getLogger("broker")
    runtime = Runtime(config)
    try:
        runtime.acquire()
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except StartupError as error:
        log.error("%s", error)
        return EXIT_STARTUP
    try:
        return uvloop.run(Supervisor(config, runtime, log_level, reload).run())
    except OSError as error:
        log.error("start-up failed: %s", error)
        return EXIT_STARTUP
    finally:
        runtime.release()


if __name__ == "__main__":
    without_test_strategies()
    sys.exit(main())
