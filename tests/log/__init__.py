"""The log store and what reads and writes it: produce, fetch, sessions, zero-copy, topic configs, compaction, durability."""
