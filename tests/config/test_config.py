"""Configuration: .properties parsing, key validation, and start-up failures (exit status 2)."""

import subprocess
import sys

import pytest

from broker.shared.config import ConfigError, describe_keys, load_config, parse_properties
from tests.harness import check_system_marker


def test_properties_syntax():
    text = "\n".join([
        "# comment", "! also a comment", "", "a.b = 1", "c:2", "d 3",
        "listeners=PLAINTEXT://127.0.0.1:9092,\\", "   INTERNAL://127.0.0.1:9093",
        "e=tab\\tnewline\\n", "f=\\u0041",
    ])
    assert parse_properties(text) == {
        "a.b": "1", "c": "2", "d": "3",
        "listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093",
        "e": "tab\tnewline\n", "f": "A",
    }


def test_defaults_are_kafkas():
    config = load_config({})
    assert config.props.socket_request_max_bytes == 104857600
    assert config.props.num_network_threads == 3
    assert config.props.connections_max_idle_ms == 600000
    assert [(l.name, l.host, l.port) for l in config.listeners] == [("PLAINTEXT", "", 9092)]
    assert config.inter_broker_listener == "PLAINTEXT"
    assert config.prometheus == ("127.0.0.1", 9404)
    assert config.log_dirs == ("/tmp/kafka-logs",)


def test_the_listen_backlog_absorbs_bursts_unless_set(tmp_path):
    """Kafka's 50 drops SYNs while the parent hands off: min(somaxconn, 4096)."""
    from broker.shared.config import listen_backlog

    somaxconn = tmp_path / "somaxconn"
    props = load_config({}).props
    for kernel, expected in (("128\n", 128), ("65535\n", 4096), ("4096", 4096)):
        somaxconn.write_text(kernel)
        assert listen_backlog(props, str(somaxconn)) == expected
    assert listen_backlog(props, str(tmp_path / "absent")) == 4096
    assert listen_backlog(load_config({"socket.listen.backlog.size": "50"}).props,
                          str(somaxconn)) == 50


def test_listeners_advertised_and_inter_broker():
    config = load_config({
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "advertised.listeners": "CLIENT://broker.example:9092",
        "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "broker.id": "7",
    })
    assert [l.name for l in config.listeners] == ["CLIENT", "INTERNAL"]
    assert [(l.name, l.host, l.port) for l in config.advertised] == [("CLIENT", "broker.example", 9092)]
    assert config.inter_broker_listener == "INTERNAL"
    assert config.node_id == 7
    bound = config.with_bound_ports({"CLIENT": 4000, "INTERNAL": 4001})
    assert [l.port for l in bound.listeners] == [4000, 4001]
    assert bound.advertised[0].port == 9092  # an explicit advertised port is kept


def test_prometheus_can_be_disabled():
    assert load_config({"prometheus.listen": ""}).prometheus is None


@pytest.mark.parametrize("raw, message", [
    ({"no.such.key": "1"}, "no.such.key: unknown configuration key"),
    ({"num.network.threads": "0"}, "num.network.threads: invalid value '0' (expected int >= 1)"),
    ({"num.network.threads": "three"}, "num.network.threads: invalid value 'three'"),
    ({"socket.request.max.bytes": "-5"}, "socket.request.max.bytes: invalid value '-5'"),
    ({"listeners": "SASL_SSL://:9093"},
     "ssl.keystore.location: required for SSL listener SASL_SSL"),
    ({"listeners": "SSL://:9093"}, "ssl.keystore.location: required for SSL listener SSL"),
    ({"listeners": "SASL_PLAINTEXT://:9093"},
     "sasl.enabled.mechanisms: GSSAPI for SASL listener SASL_PLAINTEXT (supported: PLAIN, "
     "SCRAM-SHA-256, SCRAM-SHA-512)"),
    ({"listeners": "FOO://:9093"}, "listeners: no security protocol for listener FOO"),
    ({"listeners": "PLAINTEXT:9092"}, "listeners: invalid listener 'PLAINTEXT:9092'"),
    ({"listeners": "PLAINTEXT://:99999"}, "out of range"),
    ({"listeners": "PLAINTEXT://:1,PLAINTEXT://:2"}, "appears more than once"),
    ({"listeners": "A://:1,B://:1", "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT"},
     "share port 1"),
    ({"advertised.listeners": "OTHER://h:1", "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT"},
     "advertised.listeners: listener OTHER is not in listeners"),
    ({"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}, "non-routable"),
    ({"inter.broker.listener.name": "NOPE"}, "inter.broker.listener.name: NOPE is not a listener"),
    ({"node.id": "1", "broker.id": "2"}, "node.id: 1 differs from broker.id 2"),
    ({"listener.security.protocol.map": "PLAINTEXT"}, "listener.security.protocol.map: invalid entry"),
    ({"prometheus.listen": "nohost"}, "prometheus.listen: invalid address"),
    ({"queued.max.request.bytes": "1000"},
     "queued.max.request.bytes: 1000 is smaller than socket.request.max.bytes 104857600"),
    ({"pybroker.queued.max.request.bytes.reserved": "PLAINTEXT:10"}, "need queued.max.request.bytes"),
    ({"queued.max.request.bytes": "200000000", "pybroker.queued.max.request.bytes.reserved": "NOPE:10"},
     "listener NOPE is not in listeners"),
    ({"queued.max.request.bytes": "104857600",
      "pybroker.queued.max.request.bytes.reserved": "PLAINTEXT:104857600"}, "leave nothing"),
])
def test_bad_configuration_names_the_key(raw, message):
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def run_broker(*args, timeout=30):
    check_system_marker()
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("override, key", [("bogus.key=1", "bogus.key"),
                                           ("num.network.threads=abc", "num.network.threads")])
@pytest.mark.system
def test_bad_config_exits_2_with_one_line(override, key):
    result = run_broker("--override", override)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"config error: {key}:")


@pytest.mark.system
def test_config_file_errors_exit_2(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("num.network.threads=abc\n")
    assert run_broker("--config", str(path)).returncode == 2
    missing = run_broker("--config", str(tmp_path / "missing.properties"))
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr


def test_every_key_is_documented():
    table = describe_keys()
    for line in table.splitlines()[2:]:
        key, kind, _default, doc = [cell.strip() for cell in line.strip("|").split("|")]
        assert key.startswith("`") and kind and doc, line


def test_dynamic_broker_keys_take_kafkas_paths(tmp_path):
    """Kafka 4.4's rules for a BROKER resource: its dynamic keys are taken (here stored without
    effect unless applied), unknown keys are kept as custom configs, static keys and unprefixed
    key store keys are refused, per-broker keys are refused at the cluster default."""
    from broker.parent.dynamic import MAX_STORED_KEYS, ConfigProblem, DynamicConfig

    dynamic = DynamicConfig(load_config({"log.dirs": str(tmp_path)}))

    def alter(key, value, operation=0, cluster_default=False):
        layer = {}
        try:
            dynamic.alter(layer, key, operation, value, cluster_default)
        except ConfigProblem as problem:
            return problem.code, str(problem)
        return layer[key]

    assert [dynamic.classify(key) for key in (
        "max.connections", "sasl.kerberos.min.time.before.relogin", "message.max.bytes",
        "listener.name.plaintext.ssl.client.auth", "my.plugin.key", "log.dirs",
        "prometheus.listen")] == ["applied", "stored", "stored", "stored", "custom", "static",
                                  "static"]
    assert alter("sasl.kerberos.min.time.before.relogin", "61000") == "61000"
    assert alter("log.cleanup.policy", "compact", operation=2) == "delete,compact"  # APPEND
    assert alter("compression.gzip.level", "0") == (
        "invalid_request", "Invalid value 0 for configuration compression.gzip.level: Value must "
                           "be between 1 and 9 or equal to -1")
    assert alter("log.dirs", "/x") == ("invalid_request",
                                       "Cannot update these configs dynamically: [log.dirs]")
    assert alter("ssl.keystore.type", "PEM")[1].startswith(
        "These security configs can be dynamically updated only per-listener")
    assert alter("sasl.kerberos.min.time.before.relogin", "1", cluster_default=True)[1] == (
        "Cannot update these configs at default cluster level, broker id must be specified: "
        "[sasl.kerberos.min.time.before.relogin]")
    assert alter("listener.name.plaintext.max.connections", "9", cluster_default=True) == "9"
    assert alter("retention.of.my.plugin", "x", operation=2)[0] == "invalid_config"
    assert [dynamic.sensitive(key) for key in (
        "my.plugin.key", "listener.name.a.sasl.jaas.config", "message.max.bytes")] == \
        [True, True, False]
    with pytest.raises(ConfigProblem, match="at most 1000 keys"):
        dynamic.check_room({f"my.plugin.key.{n}": "x" for n in range(MAX_STORED_KEYS + 1)})
