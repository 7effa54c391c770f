"""Metrics, the connections view, the status endpoint, the event log and the PySpark report."""
