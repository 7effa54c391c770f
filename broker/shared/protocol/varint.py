"""Kafka's variable-length integers, written (reading is the request guard's: guard.py):
unsigned (compact lengths, tagged fields) and zigzag (record fields)."""

from __future__ import annotations


def uvarint(value: int) -> bytes:
    """An unsigned varint: 7 bits a byte, low bits first."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> bytes:
    """A signed 64-bit value as records write it: zigzag, then unsigned."""
    return uvarint(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)
