"""The key table `python -m broker --describe-config` prints (and the README shows): each
declared key with its type, bounds, default and doc, read from the key catalogue.
"""

from __future__ import annotations

from broker.shared.config.keys import declared_keys, key_doc, key_metas


def describe_keys() -> str:
    """The key table printed by `python -m broker --describe-config` and shown in the README."""
    lines = ["| key | type | default | doc |", "|---|---|---|---|"]
    for field in declared_keys():
        metas = key_metas(field.type)
        bounds = ""
        if metas and (metas[0].ge is not None or metas[0].le is not None):
            low = "" if metas[0].ge is None else metas[0].ge
            high = "" if metas[0].le is None else metas[0].le
            bounds = f" [{low}..{high}]"
        default = "" if field.default is None else repr(field.default)
        doc = key_doc(field.encode_name)
        lines.append(f"| `{field.encode_name}` | {_type_name(field.type)}{bounds} | {default} | {doc} |")
    return "\n".join(lines)


def _type_name(annotation) -> str:
    if getattr(annotation, "__metadata__", None) is not None:
        return _type_name(annotation.__origin__)
    members = [arg for arg in getattr(annotation, "__args__", ()) if arg is not type(None)]
    if members:
        return _type_name(members[0])
    return {int: "int", bool: "boolean", str: "string"}.get(annotation, str(annotation))
