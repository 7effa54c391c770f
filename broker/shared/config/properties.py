"""The raw key/value pairs a broker starts from: Java `.properties` text (comments, `=`, `:`
or blank separators, continuation lines, escapes), a `.properties` file read whole, and
`--override key=value` arguments; also `split_csv`, the comma-separated lists many values are.

Only `read_properties_file` touches a file; nothing here knows which keys exist (the key
catalogue, broker.shared.config.keys, does).
"""

from __future__ import annotations

import re

from broker.shared.config.keys import ConfigError

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _logical_lines(text: str):
    """Yield (line number, logical line), joining lines that end in an odd number of '\\'."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending, start = pending + line[:-1], start or number
            continue
        yield (start or number), pending + line
        pending, start = "", 0
    if pending:
        yield start, pending


_SEPARATOR = re.compile(r"(?<!\\)(\s*[=:]\s*|\s+)")


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `.properties` text: comments, `=`/`:`/space separators, continuations."""
    result: dict[str, str] = {}
    for _number, line in _logical_lines(text):
        match = _SEPARATOR.search(line)
        if match is None:
            key, value = line, ""
        else:
            key, value = line[:match.start()], line[match.end():]
        result[_unescape(key)] = _unescape(value)
    return result


def read_properties_file(path: str) -> dict[str, str]:
    """The pairs of a `.properties` file (UTF-8), or ConfigError when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_properties(handle.read())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """The pairs of `--override key=value` arguments, key and value stripped."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {pair!r}: expected key=value")
        result[key.strip()] = value.strip()
    return result


def split_csv(value: str) -> list[str]:
    """The items of a comma-separated value, stripped, blanks left out."""
    return [item.strip() for item in value.split(",") if item.strip()]
