"""The incident pipeline: PySpark jobs over the broker's event logs (see pipeline/job.py)."""
