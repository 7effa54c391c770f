"""Fixtures of the observability tests: one Spark session for the whole run."""

import os

import pytest

from tests.observability.helpers import submit_args


@pytest.fixture(scope="session")
def spark():
    """A local Spark session whose driver runs with TEST_JVM_OPTIONS, started on first use."""
    from pipeline.load import spark_session

    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args()  # read as the driver's JVM starts
    try:
        session = spark_session()
    finally:
        if before is None:
            del os.environ["PYSPARK_SUBMIT_ARGS"]
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before
    yield session
    session.stop()
