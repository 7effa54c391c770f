"""The shared-memory counter block mapped by the parent and every worker (see block.py)."""
