"""Group configs (GROUP resources of DescribeConfigs, IncrementalAlterConfigs and AlterConfigs):
validated in Kafka's words, described with their sources, refused without the group's ACLs or
off the control plane, kept across a restart of the admin service; and a real client's
share.auto.offset.reset set and described through confluent-kafka's AdminClient."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from broker.parent.admin import AdminService
from broker.parent.dynamic import DynamicConfig
from broker.parent.group_configs import DEFAULT_CONFIG, GROUP_CONFIG, GroupConfigs, reset_problem
from broker.shared.access import Access
from broker.shared.acl import Acl, Operation, PatternType, Permission, ResourceType
from broker.shared.config import ConfigError, load_config
from tests.wire import decode_response, request

GROUP = 32  # Kafka's ConfigResource.Type.GROUP
DESCRIBE, INCREMENTAL, LEGACY = 32, 44, 33
SET, DELETE, APPEND = 0, 1, 2


class Admin:
    """An AdminService over a log dir, asked as the router asks it."""

    def __init__(self, directory: str, access: Access | None = None, may_alter=None,
                 **settings):
        raw = {"log.dirs": directory}
        raw.update({key.replace("_", "."): value for key, value in settings.items()})
        self.config = load_config(raw)
        self.service = AdminService(0, DynamicConfig(self.config), on_change=lambda: None,
                                    may_alter=may_alter, access=access or Access(False))

    def ask(self, api_key: int, version: int, values: dict):
        answer = self.service.handle(request(api_key, version, values), 0, "10.0.0.1:1", "alice")
        return decode_response(api_key, version, answer[4:])[1]

    def alter(self, group: str, *configs, validate_only: bool = False):
        result, = self.ask(INCREMENTAL, 1, {"validate_only": validate_only, "resources": [{
            "resource_type": GROUP, "resource_name": group, "configs": [
                {"name": name, "config_operation": operation, "value": value}
                for name, operation, value in configs]}]}).responses
        return result

    def describe(self, group: str, keys=None, synonyms: bool = False):
        result, = self.ask(DESCRIBE, 4, {
            "resources": [{"resource_type": GROUP, "resource_name": group,
                           "configuration_keys": keys}],
            "include_synonyms": synonyms, "include_documentation": True}).results
        return result

    def values(self, group: str) -> dict:
        return {entry.name: (entry.value, entry.config_source)
                for entry in self.describe(group).configs}

    def close(self) -> None:
        self.service.group_configs.close()


@pytest.fixture
def admin(tmp_path):
    running = Admin(str(tmp_path))
    yield running
    running.close()


def test_a_group_without_configs_shows_the_brokers_defaults(admin):
    described = admin.describe("g")
    assert described.error_code == ErrorCode.none
    assert admin.values("g") == {
        "consumer.session.timeout.ms": ("45000", DEFAULT_CONFIG),
        "consumer.heartbeat.interval.ms": ("5000", DEFAULT_CONFIG),
        "share.session.timeout.ms": ("45000", DEFAULT_CONFIG),
        "share.heartbeat.interval.ms": ("5000", DEFAULT_CONFIG),
        "share.record.lock.duration.ms": ("30000", DEFAULT_CONFIG),
        "share.auto.offset.reset": ("latest", DEFAULT_CONFIG)}
    reset = next(e for e in described.configs if e.name == "share.auto.offset.reset")
    assert reset.documentation.startswith("The strategy to initialize the share-partition")
    assert reset.config_type == 2 and not reset.read_only  # STRING


def test_alter_sets_and_deletes_and_describe_shows_the_groups_own(admin):
    assert admin.alter("g", ("share.auto.offset.reset", SET, "earliest"),
                       ("share.record.lock.duration.ms", SET, " 20000 ")).error_code == \
        ErrorCode.none
    values = admin.values("g")
    assert values["share.auto.offset.reset"] == ("earliest", GROUP_CONFIG)
    assert values["share.record.lock.duration.ms"] == ("20000", GROUP_CONFIG)
    assert admin.values("other")["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)
    assert admin.service.group_configs.value("g", "share.auto.offset.reset") == "earliest"
    asked = admin.describe("g", keys=["share.record.lock.duration.ms", "nope"], synonyms=True)
    entry, = asked.configs  # a key Kafka does not know is left out
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
        ("share.record.lock.duration.ms", "20000", GROUP_CONFIG),
        ("group.share.record.lock.duration.ms", "30000", DEFAULT_CONFIG)]
    assert admin.alter("g", ("share.auto.offset.reset", DELETE, None)).error_code == \
        ErrorCode.none
    assert admin.values("g")["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)


def test_validate_only_and_legacy_alter_configs(admin):
    admin.alter("g", ("share.auto.offset.reset", SET, "earliest"), validate_only=True)
    assert admin.values("g")["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)
    admin.alter("g", ("share.auto.offset.reset", SET, "earliest"))
    result, = admin.ask(LEGACY, 2, {"validate_only": False, "resources": [{
        "resource_type": GROUP, "resource_name": "g",
        "configs": [{"name": "share.session.timeout.ms", "value": "50000"}]}]}).responses
    assert result.error_code == ErrorCode.none
    values = admin.values("g")  # the whole set replaced, as AlterConfigs does
    assert values["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)
    assert values["share.session.timeout.ms"] == ("50000", GROUP_CONFIG)


@pytest.mark.parametrize("configs, code, message", [
    ([("share.auto.offset.rest", SET, "earliest")], ErrorCode.invalid_config,
     "Unknown group config name: share.auto.offset.rest"),
    ([("share.auto.offset.reset", SET, "EARLIEST")], ErrorCode.invalid_config,
     "Invalid value EARLIEST for configuration share.auto.offset.reset: Invalid value "
     "`EARLIEST` for configuration share.auto.offset.reset. The value must be either "
     "'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."),
    ([("share.session.timeout.ms", SET, "soon")], ErrorCode.invalid_config,
     "Invalid value soon for configuration share.session.timeout.ms: Not a number of type INT"),
    ([("share.record.lock.duration.ms", SET, "999")], ErrorCode.invalid_config,
     "Invalid value 999 for configuration share.record.lock.duration.ms: Value must be at "
     "least 1000"),
    ([("share.record.lock.duration.ms", SET, "61000")], ErrorCode.invalid_config,
     "share.record.lock.duration.ms must be in the range 15000 to 60000 inclusive."),
    ([("consumer.heartbeat.interval.ms", SET, "4000")], ErrorCode.invalid_config,
     "consumer.heartbeat.interval.ms must be in the range 5000 to 15000 inclusive."),
    ([("share.session.timeout.ms", SET, "61000")], ErrorCode.invalid_config,
     "share.session.timeout.ms must be in the range 45000 to 60000 inclusive."),
    ([("share.auto.offset.reset", APPEND, "earliest")], ErrorCode.invalid_config,
     "Config value append is not allowed for config key: share.auto.offset.reset"),
])
def test_bad_group_configs_are_refused_in_kafkas_words(admin, configs, code, message):
    refused = admin.alter("g", *configs)
    assert (refused.error_code, refused.error_message) == (code, message)
    assert all(source == DEFAULT_CONFIG for _, source in admin.values("g").values())


def test_a_session_timeout_must_outlast_its_heartbeat_interval(tmp_path):
    admin = Admin(str(tmp_path), group_share_min_session_timeout_ms="1000",
                  group_share_min_heartbeat_interval_ms="1000")
    refused = admin.alter("g", ("share.session.timeout.ms", SET, "5000"))
    assert (refused.error_code, refused.error_message) == (
        ErrorCode.invalid_config,
        "share.session.timeout.ms must be greater than share.heartbeat.interval.ms")
    assert admin.alter("g", ("share.session.timeout.ms", SET, "5000"),
                       ("share.heartbeat.interval.ms", SET, "1000")).error_code == ErrorCode.none
    admin.close()


def test_the_default_group_and_a_data_listener_are_refused(tmp_path, admin):
    assert (admin.alter("", ("share.auto.offset.reset", SET, "earliest")).error_message ==
            "Default group resources are not allowed.")
    assert admin.describe("").error_code == ErrorCode.invalid_request
    (tmp_path / "other").mkdir()
    control_only = Admin(str(tmp_path / "other"), may_alter=lambda _listener: False)
    refused = control_only.alter("g", ("share.auto.offset.reset", SET, "earliest"))
    assert refused.error_code == ErrorCode.cluster_authorization_failed
    assert control_only.values("g")["share.auto.offset.reset"] == ("latest", DEFAULT_CONFIG)
    control_only.close()


def test_acls_on_the_group_decide_who_describes_and_alters(tmp_path):
    access = Access(True)
    access.update([Acl(ResourceType.GROUP, "mine", PatternType.LITERAL, "User:alice", "*",
                       operation, Permission.ALLOW)
                   for operation in (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS)])
    admin = Admin(str(tmp_path), access=access)
    assert admin.alter("mine", ("share.auto.offset.reset", SET, "earliest")).error_code == \
        ErrorCode.none
    assert admin.describe("mine").error_code == ErrorCode.none
    assert admin.alter("theirs", ("share.auto.offset.reset", SET, "earliest")).error_code == \
        ErrorCode.group_authorization_failed
    assert admin.describe("theirs").error_code == ErrorCode.group_authorization_failed
    admin.close()


def test_group_configs_survive_a_restart(tmp_path):
    admin = Admin(str(tmp_path))
    admin.alter("g", ("share.auto.offset.reset", SET, "earliest"))
    admin.alter("h", ("consumer.session.timeout.ms", SET, "50000"))
    admin.alter("h", ("consumer.session.timeout.ms", DELETE, None))
    admin.close()
    again = Admin(str(tmp_path))
    assert again.values("g")["share.auto.offset.reset"] == ("earliest", GROUP_CONFIG)
    assert again.values("h")["consumer.session.timeout.ms"] == ("45000", DEFAULT_CONFIG)
    assert again.service.group_configs.configs == {"g": {"share.auto.offset.reset": "earliest"}}
    again.close()


@pytest.mark.parametrize("value, accepted", [
    ("earliest", True), ("latest", True), ("by_duration:PT1H", True), ("by_duration:pt1h", True),
    ("by_duration:P1DT2H3M4.5S", True), ("by_duration:P-1DT25H", True), ("by_duration:PT0S", True),
    ("by_duration:", False), ("by_duration:PT", False), ("by_duration:P1DT", False),
    ("by_duration:-PT1H", False), ("by_duration:PT-0.5S", False), ("BY_DURATION:PT1S", False),
    ("by_duration: PT1H", False), ("bogus", False)])
def test_share_auto_offset_reset_takes_what_kafka_takes(value, accepted):
    """Each verdict is Kafka 4.4's GroupConfig's (ShareGroupAutoOffsetResetStrategy)."""
    assert (reset_problem(value) is None) == accepted


def test_the_record_lock_duration_must_lie_within_the_brokers_bounds(tmp_path):
    with pytest.raises(ConfigError, match="group.share.min.record.lock.duration.ms 15000"):
        load_config({"log.dirs": str(tmp_path), "group.share.record.lock.duration.ms": "10000"})
    props = load_config({"log.dirs": str(tmp_path), "group.share.record.lock.duration.ms": "10000",
                         "group.share.min.record.lock.duration.ms": "5000"}).props
    assert GroupConfigs(props).value("g", "share.record.lock.duration.ms") == "10000"


@pytest.mark.system
def test_a_share_groups_reset_set_by_a_real_admin_client_is_described(broker):
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, ConfigSource, ResourceType)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.GROUP, "configured-share-group", incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)
    described = admin.describe_configs([ConfigResource(ResourceType.GROUP,
                                                       "configured-share-group")])
    entries, = (future.result(timeout=20) for future in described.values())
    reset = entries["share.auto.offset.reset"]
    assert (reset.value, reset.source) == ("earliest", ConfigSource.GROUP_CONFIG.value)
    assert entries["share.session.timeout.ms"].source == ConfigSource.DEFAULT_CONFIG.value
