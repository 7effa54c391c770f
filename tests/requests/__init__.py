"""The request path in a worker: connections, framing, the router and its answers, muting, backpressure, the memory pool (KIP-72), the request guard."""
