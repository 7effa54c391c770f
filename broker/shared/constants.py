"""Numbers both kinds of process agree on, defined once."""

INT_MAX = 2**31 - 1  # Kafka's int32 ceiling: "unlimited" for counts, rates and sizes

# A worker exits with this status when it fails before it ever served; the supervisor then
# halts the broker rather than crash-loop.
WORKER_BOOT_ERROR = 3

# Every process logs to stderr in this format (the pid tells the processes apart).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
