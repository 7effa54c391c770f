"""Bounds, hostile clients, fuzzing, and the house rules a tool can check."""
