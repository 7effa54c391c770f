"""Helpers of the compatibility tests: Kafka's Java clients run as one JVM of scenarios."""

from __future__ import annotations

import json
import subprocess

from loadtest.apache_kafka import java_command

MAIN = "pybroker.compat.ClientsCheck"


def run_scenarios(bootstrap: str, scenarios, configs=(), timeout: float = 240) -> dict:
    """Runs ClientsCheck once: {scenario: its line}, plus "_stderr" (the JVM's log)."""
    args = [bootstrap]
    for config in configs:
        args += ["--config", config]
    result = subprocess.run(java_command(MAIN, [*args, *scenarios]), capture_output=True,
                            text=True, timeout=timeout)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    answers = {line["scenario"]: line for line in lines}
    answers["_stderr"] = f"exit {result.returncode}\n{result.stderr[-6000:]}"
    return answers


def facts(answers: dict, scenario: str) -> dict:
    line = answers.get(scenario)
    assert line is not None, f"{scenario} printed nothing:\n{answers['_stderr']}"
    assert line["ok"], f"{scenario} failed: {line.get('error')}\n{answers['_stderr']}"
    return line["facts"]
