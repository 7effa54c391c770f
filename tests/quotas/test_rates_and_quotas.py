"""Admission arithmetic with a fake clock: Kafka's windowed rate, quotas, overrides."""

import ipaddress

import pytest

from broker.parent.admission import ConnectionQuotas, Limits, Verdict
from broker.parent.rates import Rate
from broker.shared.constants import INT_MAX
from broker.shared.overrides import parse_ip_overrides


def test_fresh_sensor_allows_the_burst_kafka_allows():
    # Kafka's test: with 2 samples, exactly `limit` events pass at t=0 and the next violates.
    rate = Rate(window=1.0, samples=2)
    for _ in range(5):
        rate.record(1, now=0.0)
        assert rate.throttle(5, now=0.0) == 0
    rate.record(1, now=0.0)
    assert rate.throttle(5, now=0.0) == pytest.approx((6 - 5) / 5 * 1.0)


def test_default_burst_is_ten_windows_and_configurable():
    kafka_like = Rate(window=1.0, samples=11)
    for _ in range(100):
        kafka_like.record(1, now=0.0)
    assert kafka_like.throttle(10, now=0.0) == 0  # 10/s x 10 windows pass at once
    explicit = Rate(window=1.0, samples=11, burst_windows=1)
    for _ in range(11):
        explicit.record(1, now=0.0)
    assert explicit.throttle(10, now=0.0) > 0  # only one window's worth


def test_throttle_formula_and_cap():
    rate = Rate(window=1.0, samples=11)
    for _ in range(300):
        rate.record(1, now=0.0)
    # observed 30/s over the 10 s floor, limit 10/s: (30-10)/10 * 10 s = 20 s, capped at 1 s.
    assert rate.throttle(10, now=0.0) == pytest.approx(20.0)
    assert rate.throttle(10, now=0.0, cap=1.0) == 1.0


def test_old_samples_expire():
    rate = Rate(window=1.0, samples=3)
    rate.record(50, now=0.0)
    assert rate.measure(now=0.5) > 0
    assert rate.measure(now=10.0) == 0


def test_rate_validation():
    with pytest.raises(ValueError):
        Rate(window=0, samples=3)
    with pytest.raises(ValueError):
        Rate(window=1, samples=3, burst_windows=3)


def quotas(**limits) -> ConnectionQuotas:
    return ConnectionQuotas(2, protected=1, limits=Limits(**limits), window=1.0, samples=2,
                            burst_windows=1)


def test_room_respects_broker_and_listener_limits_but_not_for_the_protected_listener():
    q = quotas(max_connections=3, listener_max_connections={1: 10})
    for conn_id in range(3):
        q.opened(conn_id, 0, "10.0.0.1")
    assert q.room(0) == 0 and q.room(1) == 10
    q.opened(99, 1, "10.0.0.2")
    assert q.excess() == 1
    q.closed(0)
    assert q.excess() == 0 and q.room(0) == 0
    assert q.closed(0) is None  # double release is ignored


def test_per_ip_limit_is_checked_before_any_rate():
    q = quotas(max_connections_per_ip=1, max_connection_creation_rate=1)
    assert q.admit(0, "10.0.0.1", now=0.0).verdict is Verdict.ADMIT
    q.opened(1, 0, "10.0.0.1")
    assert q.admit(0, "10.0.0.1", now=0.0).verdict is Verdict.REJECT_IP_LIMIT
    assert q.broker_rate(now=0.0) == 1.0  # the rejected one was not charged


def test_ip_rate_throttles_without_charging_broker_or_listener():
    q = quotas(ip_creation_rate_default=2)
    verdicts = [q.admit(0, "10.0.0.7", now=0.0) for _ in range(3)]
    assert [d.verdict for d in verdicts] == [Verdict.ADMIT, Verdict.ADMIT, Verdict.THROTTLE_IP]
    assert 0 < verdicts[2].delay <= 1.0
    assert q.listener_rate(0, now=0.0) == 2.0 and q.broker_rate(now=0.0) == 2.0
    assert q.admit(0, "10.0.0.8", now=0.0).verdict is Verdict.ADMIT  # another IP


def test_listener_and_broker_rates_ask_the_acceptor_to_pause():
    q = quotas(max_connection_creation_rate=2, listener_creation_rate={0: 5})
    delays = [q.admit(0, f"10.0.0.{i}", now=0.0).delay for i in range(3)]
    assert delays[:2] == [0, 0] and delays[2] > 0  # the broker rate bites first
    protected = [q.admit(1, f"10.0.1.{i}", now=0.0).delay for i in range(5)]
    assert protected == [0] * 5  # the inter-broker listener is exempt from the broker rate


def test_override_precedence_exact_over_cidr_over_default():
    overrides = parse_ip_overrides("10.0.0.0/8:5,10.1.2.3:1,10.1.0.0/16:3")
    limits = Limits(max_connections_per_ip=7, ip_overrides=overrides)
    assert limits.per_ip_limit("10.1.2.3") == 1
    assert limits.per_ip_limit("10.1.9.9") == 3
    assert limits.per_ip_limit("10.9.9.9") == 5
    assert limits.per_ip_limit("192.168.1.1") == 7


def test_host_names_resolve_to_every_address():
    overrides = parse_ip_overrides("localhost:4")
    networks = {network for network, _ in overrides}
    assert ipaddress.ip_network("127.0.0.1/32") in networks
    assert all(limit == 4 for _, limit in overrides)


@pytest.mark.parametrize("text", ["10.0.0.1", "10.0.0.1:x", "10.0.0.1:-1", "no-such-host.invalid:3"])
def test_bad_override_entries_are_refused(text):
    with pytest.raises(ValueError, match="max.connections.per.ip.overrides"):
        parse_ip_overrides(text)


def test_unlimited_by_default():
    q = quotas()
    assert q.room(0) == INT_MAX and q.admit(0, "::1", now=0.0).delay == 0


def test_idle_ip_sensors_expire():
    q = quotas(ip_creation_rate_default=100)
    q.admit(0, "10.0.0.1", now=0.0)
    q.expire_rate_sensors(now=10.0)
    assert q.tracked_ips() == 1  # still in use
    q.expire_rate_sensors(now=4000.0)
    assert q.tracked_ips() == 0


def test_the_control_plane_listener_is_outside_every_data_plane_limit():
    q = ConnectionQuotas(2, protected=None, control_plane=1, window=1.0, samples=2,
                         burst_windows=1, limits=Limits(
                             max_connections=1, max_connections_per_ip=1,
                             max_connection_creation_rate=1, ip_creation_rate_default=1,
                             listener_max_connections={1: 2}))
    assert q.admit(0, "10.0.0.1", now=0.0).verdict is Verdict.ADMIT
    q.opened(1, 0, "10.0.0.1")
    assert q.room(0) == 0  # the data listener is full: max.connections and per IP
    for conn_id in (2, 3):  # the same address still gets in, unthrottled, uncounted
        decision = q.admit(1, "10.0.0.1", now=0.0)
        assert decision.verdict is Verdict.ADMIT and decision.delay == 0
        q.opened(conn_id, 1, "10.0.0.1")
    assert (q.total, q.per_ip, q.excess()) == (1, {"10.0.0.1": 1}, 0)
    assert q.room(1) == 0  # its own listener limit
    q.closed(2)
    assert q.room(1) == 1 and q.total == 1 and q.per_ip == {"10.0.0.1": 1}
    assert q.broker_rate(0.0) == 1  # only the data connection was charged


def test_the_control_plane_has_a_connection_limit_by_default(tmp_path):
    from broker.parent.dynamic import CONTROL_PLANE_MAX_CONNECTIONS, DynamicConfig
    from broker.shared.config import load_config

    raw = {"listeners": "CLIENT://:9092,CONTROLLER://:9094", "log.dirs": str(tmp_path),
           "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
           "control.plane.listener.name": "CONTROLLER"}
    assert DynamicConfig(load_config(raw)).limits().listener_max(1) == \
        CONTROL_PLANE_MAX_CONNECTIONS == 100
    raw["listener.name.controller.max.connections"] = "7"
    assert DynamicConfig(load_config(raw)).limits().listener_max(1) == 7
    del raw["control.plane.listener.name"]
    raw.pop("listener.name.controller.max.connections")
    assert DynamicConfig(load_config(raw)).limits().listener_max(1) == 2**31 - 1


def test_quota_sensors_are_reused_after_idling_and_never_shared(tmp_path):
    """256 sensors used to be all, and every later client shared the last one."""
    from broker.shared.client_quotas import PRODUCE, QuotaSensors
    from shm.block import SharedBlock

    block = SharedBlock.create(str(tmp_path / "block"), slots=2, listeners=1, quota_entities=16,
                               quota_windows=2)
    try:
        first, second = (QuotaSensors(block, slot, 1.0, 2, None, slots=2, max_throttle_seconds=10)
                         for slot in (0, 1))
        t0 = 1_000 * 10**9
        held = {}
        for n in range(16):  # from two workers: one table
            sensors = first if n % 2 else second
            held[n] = sensors.entity(f"client-id=c{n}", now_ns=t0)
            sensors.record(PRODUCE, held[n], 10, now_ns=t0)
        assert sorted(held.values()) == list(range(16))
        assert first.entity("client-id=stranger", now_ns=t0) is None  # full: not shared
        later = t0 + 3 * 10**9  # every sensor idle for more than the 2-window span
        index = first.entity("client-id=stranger", now_ns=later)
        assert index is not None
        first.record(PRODUCE, index, 5000, now_ns=later)
        owner = [n for n, slot in held.items() if slot == index][0]
        again = second.entity(f"client-id=c{owner}", now_ns=later)  # its old sensor is gone
        assert again not in (None, index)
        assert second.measure(PRODUCE, again, now_ns=later)[0] == 0  # no stranger's bytes
    finally:
        block.close()


# --- per-principal limits ---------------------------------------------------

def _authenticated(q: ConnectionQuotas, conn_id: int, user: str, now: float = 0.0,
                   listener: int = 0) -> Verdict:
    q.opened(conn_id, listener, f"10.0.0.{conn_id}")
    return q.claim_user(conn_id, user, now).verdict


def test_the_per_user_count_is_exact_and_released_on_close():
    q = quotas(max_connections_per_user=2, user_overrides={"batch": 0, "svc": 3})
    assert [_authenticated(q, i, "alice") for i in (1, 2, 3)] == \
        [Verdict.ADMIT, Verdict.ADMIT, Verdict.REJECT_USER_LIMIT]
    assert q.per_user == {"alice": 2}  # the refused one is not counted
    assert _authenticated(q, 4, "bob") is Verdict.ADMIT  # each principal its own count
    assert [_authenticated(q, i, "svc") for i in (5, 6, 7, 8)].count(Verdict.ADMIT) == 3
    assert _authenticated(q, 9, "batch") is Verdict.REJECT_USER_LIMIT  # 0: never
    q.closed(1)
    q.closed(3)  # refused, then closed: nothing of alice's to release
    assert q.per_user["alice"] == 1
    assert _authenticated(q, 10, "alice") is Verdict.ADMIT
    for conn_id in (2, 10, 4):
        q.closed(conn_id)
    assert "alice" not in q.per_user and "bob" not in q.per_user


def test_the_per_user_rate_refuses_without_charging_the_refused():
    q = quotas(user_creation_rate=2, user_rate_overrides={"fast": 100})
    verdicts = [_authenticated(q, i, "alice", now=0.0) for i in range(1, 6)]
    assert verdicts[:2] == [Verdict.ADMIT, Verdict.ADMIT]
    assert set(verdicts[2:]) == {Verdict.THROTTLE_USER}
    assert _authenticated(q, 6, "alice", now=1.5) is Verdict.ADMIT  # the window moved on
    assert all(_authenticated(q, i, "fast") is Verdict.ADMIT for i in range(10, 20))
    assert q.tracked_users() == 2
    q.expire_rate_sensors(now=5000.0)
    assert q.tracked_users() == 0


def test_per_user_claims_outside_the_data_plane_or_repeated_are_not_counted():
    q = ConnectionQuotas(2, protected=None, control_plane=1, window=1.0, samples=2,
                         burst_windows=1, limits=Limits(max_connections_per_user=1))
    assert _authenticated(q, 1, "alice", listener=1) is Verdict.ADMIT  # the control plane
    assert _authenticated(q, 2, "alice") is Verdict.ADMIT
    assert q.claim_user(2, "alice", 0.0).verdict is Verdict.ADMIT  # asked twice: counted once
    assert q.claim_user(99, "alice", 0.0).verdict is Verdict.ADMIT  # gone already: nothing to count
    assert q.per_user == {"alice": 1}
    assert _authenticated(q, 3, "alice") is Verdict.REJECT_USER_LIMIT


def test_per_user_limits_are_dynamic_keys_with_overrides(tmp_path):
    from broker.parent.dynamic import ConfigProblem, DynamicConfig
    from broker.shared.config import ConfigError, load_config

    raw = {"listeners": "PLAINTEXT://:9092", "log.dirs": str(tmp_path),
           "pybroker.max.connections.per.user": "5",
           "pybroker.max.connections.per.user.overrides": "svc:50, batch:0"}
    dynamic = DynamicConfig(load_config(raw))
    limits = dynamic.limits()
    assert (limits.per_user_limit("alice"), limits.per_user_limit("svc"),
            limits.per_user_limit("batch"), limits.user_rate("alice")) == (5, 50, 0, INT_MAX)
    layer: dict[str, str] = {}
    dynamic.alter(layer, "pybroker.max.connection.creation.rate.per.user", 0, "3")
    dynamic.alter(layer, "pybroker.max.connections.per.user.overrides", 2, "ops:1")  # APPEND
    dynamic.alter(layer, "pybroker.max.connection.creation.rate.per.user.overrides", 0,
                  "svc:reports:9")  # a name may hold ':' (the last one splits)
    dynamic.stored.broker = layer
    limits = dynamic.limits()
    assert limits.per_user_limit("ops") == 1 and limits.per_user_limit("svc") == 50
    assert limits.user_rate("alice") == 3 and limits.user_rate("svc:reports") == 9
    with pytest.raises(ConfigProblem, match="invalid entry 'alice'"):
        dynamic.alter(layer, "pybroker.max.connections.per.user.overrides", 0, "alice")
    with pytest.raises(ConfigProblem, match="Not a number"):
        dynamic.alter(layer, "pybroker.max.connections.per.user", 0, "many")
    raw["pybroker.max.connections.per.user.overrides"] = "svc:-1"
    with pytest.raises(ConfigError, match="^pybroker.max.connections.per.user.overrides: "):
        load_config(raw)


# --- shadow mode ---------------------------------------------------------


def test_shadowed_connection_limits_admit_and_name_what_they_would_have_done():
    q = quotas(max_connections=2, max_connections_per_ip=1, ip_creation_rate_default=1,
               max_connection_creation_rate=1,
               shadow=frozenset({"max.connections", "connections.per.ip",
                                 "connection.creation.rate"}))
    first = q.admit(0, "10.0.0.1", 0.0)
    assert first.verdict is Verdict.ADMIT and first.would == () and first.delay == 0
    q.opened(1, 0, "10.0.0.1")
    q.opened(2, 0, "10.0.0.2")
    assert q.room(0) > 1000 and q.excess() == 0  # max.connections observed, not enforced
    second = q.admit(0, "10.0.0.1", 0.1)
    assert second.verdict is Verdict.ADMIT and second.delay == 0
    assert set(second.would) == {"per_ip_limit", "per_ip_rate", "max_connections",
                                 "creation_rate"}


def test_an_enforced_family_still_refuses_beside_a_shadowed_one():
    q = quotas(max_connections_per_ip=1, ip_creation_rate_default=1,
               shadow=frozenset({"connection.creation.rate"}))
    q.opened(1, 0, "10.0.0.1")
    assert q.admit(0, "10.0.0.1", 0.0).verdict is Verdict.REJECT_IP_LIMIT
    q = quotas(max_connections_per_ip=1, ip_creation_rate_default=1,
               shadow=frozenset({"connections.per.ip"}))
    q.admit(0, "10.0.0.1", 0.0)
    q.opened(1, 0, "10.0.0.1")
    assert q.admit(0, "10.0.0.1", 0.1).verdict is Verdict.THROTTLE_IP  # the rate is enforced


def test_shadowed_user_limits_admit_and_count():
    q = quotas(max_connections_per_user=1, user_creation_rate=1,
               shadow=frozenset({"connections.per.user", "connection.creation.rate"}))
    q.opened(1, 0, "10.0.0.1")
    q.opened(2, 0, "10.0.0.2")
    assert q.claim_user(1, "alice", 0.0).would == ()
    decision = q.claim_user(2, "alice", 0.1)
    assert decision.verdict is Verdict.ADMIT
    assert set(decision.would) == {"per_user_limit", "per_user_rate"}
    assert q.per_user["alice"] == 2  # counted: the connection is there
