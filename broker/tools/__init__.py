"""Operator tools, run as `python -m broker <tool>` beside a running broker: they run in
neither the parent nor a worker, and reach the broker only through what it serves (its
status endpoint).  `connections`: who is connected, busiest first."""
