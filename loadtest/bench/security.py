"""security: the cost of TLS and SASL, all on one broker of 2 workers with a
PLAINTEXT, an SSL and a SASL_PLAINTEXT listener (certificates made by trustme), in one pass:

  requests    ApiVersions per second over SSL / over PLAINTEXT (loadtest/secure_client.py,
              2 processes x 10 connections x 20 in flight);
  produce     confluent-kafka 1 KiB records, MB/s over SSL / over PLAINTEXT;
  handshakes  connect + TLS handshake + ApiVersions + close per second / the same without TLS
              (2 client processes, 16 at a time each); the raw accept rate of the machine is
              the "raw accept+close" row of the requests table;
  scram       connect + SCRAM-SHA-256 authentication + close per second (no baseline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from loadtest.bench.common import HERE, cpu_seconds
from loadtest.bench.log import run_kafka_load
from tests.harness import BrokerProcess


def _clients(mode: str, address, seconds: float, args, ca: str | None, processes: int = 2):
    argv = [sys.executable, "-m", "loadtest.secure_client", mode, address[0], str(address[1]),
            str(seconds), *map(str, args)] + (["--ca", ca] if ca else [])
    running = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                cwd=os.path.dirname(HERE)) for _ in range(processes)]
    results = [json.loads(proc.communicate(timeout=seconds + 60)[0]) for proc in running]
    return {"count": sum(r["count"] for r in results),
            "seconds": max(r["seconds"] for r in results),
            "errors": sum(r["errors"] for r in results)}


def security_costs(seconds: float) -> dict[str, dict]:
    import trustme

    from tests.wire import create_topic

    figures = {}
    with tempfile.TemporaryDirectory(prefix="pybroker-bench-tls-") as tmp:
        ca = trustme.CA()
        ca_path, server_path = os.path.join(tmp, "ca.pem"), os.path.join(tmp, "server.pem")
        ca.cert_pem.write_to_path(ca_path)
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(server_path)
        overrides = {
            "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "ssl.keystore.location": server_path, "sasl.enabled.mechanisms": "SCRAM-SHA-256"}
        with BrokerProcess(workers=2, overrides=overrides) as broker:
            pids = [broker.pid, *broker.worker_pids.values()]
            plain, secure = broker.listeners["PLAINTEXT"], broker.listeners["SSL"]
            for name, address, ca_file in (("plaintext", plain, None), ("ssl", secure, ca_path)):
                before = cpu_seconds(pids)
                result = _clients("requests", address, seconds, (10, 20), ca_file)
                figures[f"security requests {name}"] = dict(result,
                                                            server_cpu=cpu_seconds(pids) - before)
                before = cpu_seconds(pids)
                result = _clients("handshakes", address, seconds, (16,), ca_file)
                figures[f"security handshakes {name}"] = dict(
                    result, server_cpu=cpu_seconds(pids) - before)
            create_topic(broker.bootstrap, "secure", 2)
            for name, address, extra in (
                    ("plaintext", plain, {}),
                    ("ssl", secure, {"security.protocol": "SSL", "ssl.ca.location": ca_path})):
                before = cpu_seconds(pids)
                produced = run_kafka_load("produce", f"{address[0]}:{address[1]}", "secure",
                                          seconds, 1024, json.dumps(extra))
                figures[f"security produce {name}"] = dict(
                    produced, count=produced["records"], errors=produced["failed"],
                    server_cpu=cpu_seconds(pids) - before)
            _add_scram_user(broker.bootstrap)
            before = cpu_seconds(pids)
            result = _clients("scram", broker.listeners["SASL_PLAINTEXT"], seconds,
                              (8, "bench", "bench-secret"), None)
            figures["security scram"] = dict(result, server_cpu=cpu_seconds(pids) - before)
    return figures


def _add_scram_user(bootstrap: str) -> None:
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "bench", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
            b"bench-secret")]).values():
        future.result(timeout=20)
