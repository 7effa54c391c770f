"""pybroker: a Kafka-wire-compatible broker whose network layer runs as several OS processes.

The parent process (this package's `supervisor`, `acceptor` and `metrics` modules) binds the
listeners, admits connections and hands them to worker processes (the `workers` package) by
file-descriptor passing; `shm` holds the shared counter block.  See ARCHITECTURE.md.
"""
