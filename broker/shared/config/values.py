"""Values of Kafka config keys checked as Kafka's ConfigDef checks them: the type, a range or
a set of choices, each refusal in Kafka's words ("Invalid value x for configuration k: ...").

Used where a client hands the broker a Kafka key's value at run time: a topic's configs
(broker.shared.log.topic_config) and the broker's dynamic keys (broker.parent.dynamic).
"""

from __future__ import annotations

import re

INTEGERS = {"short": (-2**15, 2**15 - 1), "int": (-2**31, 2**31 - 1), "long": (-2**63, 2**63 - 1)}
# Kafka's ConfigDef.Type of each kind, as DescribeConfigs v3+ numbers them.
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6,
                "list": 7, "class": 8, "password": 9}


class InvalidValue(ValueError):
    """A value Kafka would refuse; the message is Kafka's."""

    def __init__(self, name: str, value, reason: str):
        super().__init__(f"Invalid value {value} for configuration {name}: {reason}")


def checked(name: str, kind: str, value: str, minimum: float | None = None,
            maximum: float | None = None, choices: tuple[str, ...] = ()) -> str:
    """The value as stored (numbers and booleans normalised, lists without blanks), or
    InvalidValue.  `choices` bound a string's value or each item of a list."""
    text = value.strip()
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise InvalidValue(name, value, "Expected value to be either true or false")
        return text.lower()
    if kind in INTEGERS or kind == "double":
        number = _number(name, kind, value, text)
        if minimum is not None and number < minimum:
            raise InvalidValue(name, value, f"Value must be at least {_bound(minimum)}")
        if maximum is not None and number > maximum:
            raise InvalidValue(name, value, f"Value must be no more than {_bound(maximum)}")
        return str(number)
    if kind == "list":
        items = [item.strip() for item in text.split(",") if item.strip()]
        if choices and (not items or any(item not in choices for item in items)):
            raise InvalidValue(name, value, f"String must be one of: {', '.join(choices)}")
        return ",".join(dict.fromkeys(items) if choices else items)
    if choices and text not in choices:
        raise InvalidValue(name, value, f"String must be one of: {', '.join(choices)}")
    return text if choices else value


_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Java's parseInt and parseLong take


def _number(name: str, kind: str, value: str, text: str) -> int | float:
    try:
        if "_" in text or (kind != "double" and not _JAVA_INTEGER.fullmatch(text)):
            raise ValueError(text)  # Python would take 1_000; Java would not
        number = float(text) if kind == "double" else int(text)
    except ValueError:
        raise InvalidValue(name, value, f"Not a number of type {kind.upper()}") from None
    low, high = INTEGERS.get(kind, (None, None))
    if low is not None and not low <= number <= high:  # Java's parse overflows
        raise InvalidValue(name, value, f"Not a number of type {kind.upper()}")
    return number


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
