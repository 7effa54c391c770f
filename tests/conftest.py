"""Fixtures shared by the test modules; plain helpers live in tests/helpers.py."""

import contextlib
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


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """The test CA with the broker's certificate for 127.0.0.1 and alice's client certificate."""
    from tests.helpers import Pki

    return Pki(tmp_path_factory.mktemp("pki"))


# The shared block's layout when a module does not set BLOCK_LAYOUT (SharedBlock.create's
# keyword arguments).
BLOCK_LAYOUT = {"slots": 3, "listeners": 2}


@pytest.fixture
def block(request, tmp_path):
    """A SharedBlock of the test's own, laid out as its module's BLOCK_LAYOUT says."""
    from shm.block import SharedBlock

    layout = getattr(request.module, "BLOCK_LAYOUT", BLOCK_LAYOUT)
    created = SharedBlock.create(str(tmp_path / "block"), **layout)
    yield created
    created.close()


@pytest.fixture(scope="session")
def default_broker():
    """A broker of two workers with the default configuration, started on first use and shared
    by the modules whose tests neither restart it, change its configuration, nor count what
    other tests leave on it (connections, topics)."""
    with harness.BrokerProcess(workers=2) as running:
        yield running


@pytest.fixture(scope="session")
def configured_brokers():
    """`broker_with(overrides)`: a broker of two workers with these keys set, started on first
    use and shared by the modules that set the same keys, as `default_broker` is by those that
    set none."""
    started = {}
    with contextlib.ExitStack() as stack:
        def broker_with(overrides: dict) -> harness.BrokerProcess:
            keys = tuple(sorted(overrides.items()))
            if keys not in started:
                started[keys] = stack.enter_context(
                    harness.BrokerProcess(workers=2, overrides=overrides))
            return started[keys]

        yield broker_with


@pytest.fixture(scope="module")
def broker(request):
    """The broker of a module that does not define its own: the shared `default_broker`; the
    broker shared by the modules that set the same keys (`BROKER_OVERRIDES = {key: value}`);
    or a broker of two workers of the module's own where it needs one nothing else touched
    (`FRESH_BROKER = True`, with BROKER_OVERRIDES if it sets keys too)."""
    overrides = getattr(request.module, "BROKER_OVERRIDES", None)
    if getattr(request.module, "FRESH_BROKER", False):
        with harness.BrokerProcess(workers=2, overrides=overrides) as running:
            yield running
    elif overrides is None:
        yield request.getfixturevalue("default_broker")
    else:
        yield request.getfixturevalue("configured_brokers")(overrides)
