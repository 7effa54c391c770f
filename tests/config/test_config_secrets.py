"""Secrets altered through the admin API (key store passwords and keys) are applied but never
written out in the clear: not in the broker's log, not in the event log, not in
DescribeConfigs (Kafka logs them as [hidden] and describes them as null)."""

from __future__ import annotations

import glob
import os

import pytest

from tests.harness import BrokerProcess
from tests.security.helpers import client_context, tls_api_versions, tls_settings

pytestmark = pytest.mark.system


def test_a_key_store_secret_altered_through_the_admin_api_is_never_written_in_the_clear(
        pki, tmp_path):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    from cryptography.hazmat.primitives import serialization

    server = pki.server_cert
    password = "not-for-the-log-7f3a"
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(password.encode())
                                  ).decode()
    chain = "".join(blob.bytes().decode() for blob in server.cert_chain_pems)
    overrides = dict(tls_settings(pki), listeners="SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
                     **{"inter.broker.listener.name": "PLAINTEXT"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        changes = {"ssl.keystore.location": "", "ssl.keystore.key": encrypted,
                   "ssl.keystore.certificate.chain": chain, "ssl.key.password": password}
        resource = ConfigResource("broker", "0", incremental_configs=[
            ConfigEntry(f"listener.name.ssl.{name}", value,
                        incremental_operation=AlterConfigOpType.SET)
            for name, value in changes.items()])
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)
        assert tls_api_versions(broker.listeners["SSL"], client_context(pki)) == 7
        described = next(iter(admin.describe_configs([ConfigResource(
            "broker", "0", described_configs=["listener.name.ssl.ssl.key.password"])]).values())
            ).result(timeout=20)
        assert described["listener.name.ssl.ssl.key.password"].value is None
        assert described["listener.name.ssl.ssl.key.password"].is_sensitive
        broker.wait_for_line(r"dynamic config broker changed by")
        written = "\n".join(broker.lines)
        for path in glob.glob(os.path.join(broker.data_dir, "pybroker-events", "*.jsonl")):
            with open(path, encoding="utf-8") as handle:
                written += handle.read()
        assert "ssl.key.password" in written  # the change is recorded ...
        assert password not in written  # ... but not what it is
        assert "PRIVATE KEY" not in written
