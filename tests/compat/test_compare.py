"""`make compare` end to end on its smallest part: ApiVersions request rates against this
broker and Apache Kafka, through the runner, into the JSON the table is saved as."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loadtest.apache_kafka import classpath
from loadtest.bench.common import BIN
from tests.harness import PROJECT

ROOT = PROJECT
FIELDS = {"name", "unit", "ours", "kafka", "ratio", "better", "notes"}


@pytest.mark.system
def test_apiversions_against_both_brokers(tmp_path):
    classpath()  # raises, saying `make kafka`, when Kafka's jars are missing
    assert os.path.exists(os.path.join(BIN, "rrclient")), "build the generators: make loadgen"
    out = tmp_path / "compare.json"
    result = subprocess.run([sys.executable, "-m", "loadtest.compare", "--only", "apiversions",
                             "--seconds", "0.3", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "ApiVersions v3 requests" in result.stdout  # the table was printed
    document = json.loads(out.read_text())
    assert document["machine"]["cores"] == os.cpu_count()
    assert document["command"].endswith("--only apiversions --seconds 0.3 --out " + str(out))
    scenarios = document["scenarios"]
    assert len(scenarios) == 4  # two shapes, each a rate and a CPU cost
    for scenario in scenarios:
        assert set(scenario) == FIELDS
        assert scenario["better"] in ("higher", "lower")
        assert scenario["ours"] > 0 and scenario["kafka"] > 0, scenario
        assert scenario["ratio"] == pytest.approx(scenario["ours"] / scenario["kafka"])
    rates = [s for s in scenarios if s["unit"] == "requests/s"]
    assert len(rates) == 2 and all(s["better"] == "higher" for s in rates)
