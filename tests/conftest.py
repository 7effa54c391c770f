import os
import sys

import pytest

# Tests import the project's packages and tests.harness from the checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import harness  # noqa: E402 (after the path)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of the test runs: tell the harness whether it may start a broker."""
    harness.system_marked = item.get_closest_marker("system") is not None
