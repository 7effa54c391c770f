"""Worker processes: each runs its own uvloop, registers the connections the parent hands it,
frames and serves their requests, and mutes channels (in flight, throttled, memory)."""
