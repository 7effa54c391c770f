"""The Go clients many services use, franz-go (kgo, kadm) and Sarama, against one broker.

The programs under compat/go (built by `make go-clients` into compat/bin) each run one scenario
and print what the broker answered as one JSON object; these tests assert on those answers.
Beside them, raw-wire regression tests for what the Go clients found.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import uuid

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import PROJECT, BrokerProcess

pytestmark = pytest.mark.system  # every test here starts a broker

BIN = os.path.join(PROJECT, "compat", "bin")
RECORDS = 200
PARTITIONS = [0, 1, 2]


# Members that join an empty group together form it at once, as with Kafka's default delay
# they would after it; the group tests then take a fraction of a second.
BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}


def run(program: str, broker: BrokerProcess, scenario: str, topic: str, *extra: str) -> dict:
    """Run one scenario of a check program; its JSON answer, which must report no error."""
    path = os.path.join(BIN, program)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: build it with `make go-clients` (needs Go 1.26)")
    done = subprocess.run([path, "-bootstrap", broker.bootstrap, "-scenario", scenario,
                           "-topic", topic, "-records", str(RECORDS), "-timeout", "25s", *extra],
                          capture_output=True, text=True, timeout=40)
    assert done.stdout.strip(), f"{program} {scenario} printed nothing; stderr:\n{done.stderr}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["error"] is None, \
        f"{program} {scenario}: {answer}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0
    return answer


def per_partition(counts: dict) -> list[int]:
    return [counts.get(str(partition), 0) for partition in PARTITIONS]


# --- franz-go -------------------------------------------------------------------------------

def test_franz_go_admin_creates_describes_and_deletes_a_topic(broker):
    answer = run("franzcheck", broker, "admin", "franz-admin")
    assert answer["create"] == {"partitions": 3, "replication_factor": 1, "error": "",
                                "topic_id": answer["describe"]["topic_id"]}
    assert answer["create_again_error"] == "TOPIC_ALREADY_EXISTS"
    partitions = answer["describe"]["partitions"]
    assert [p["partition"] for p in partitions] == PARTITIONS
    assert all(p["leader"] == 0 and p["replicas"] == [0] and p["isr"] == [0] and p["error"] == ""
               for p in partitions)
    assert answer["brokers"] == [0]
    assert answer["configs"]["retention.ms"] == {"value": "3600000",
                                                 "source": "DYNAMIC_TOPIC_CONFIG"}
    assert answer["configs"]["cleanup.policy"] == {"value": "delete", "source": "DEFAULT_CONFIG"}
    assert answer["deleted"] == {"topic": "franz-admin", "topic_id": answer["create"]["topic_id"]}
    assert answer["delete_error"] == ""
    assert answer["after_delete"] == {"topics": 1, "partitions": 0,
                                      "error": "UNKNOWN_TOPIC_OR_PARTITION"}


def test_franz_go_group_reads_every_record_once_and_commits_the_end_offsets(broker):
    answer = run("franzcheck", broker, "group", "franz-group", "-members", "2")
    produced = answer["produced_consumed"]
    assert produced["acknowledged"] == RECORDS and produced["error"] == ""
    assert produced["producer_id"] >= 0  # idempotent: the broker gave the producer an id
    counts = per_partition(produced["per_partition"])
    assert sum(counts) == RECORDS and all(counts)  # keys hashed over the 3 partitions
    assert per_partition(produced["last_offset"]) == [count - 1 for count in counts]

    consumed = answer["consumed"]
    assert consumed["read"] == RECORDS and consumed["distinct_keys"] == RECORDS
    assert consumed["duplicates"] == 0 and consumed["unexpected"] == 0
    held = consumed["assigned_before_produce"]  # two members, each its own partitions
    assert sorted(p for member in held for p in member) == PARTITIONS and all(held)
    assert consumed["commit_errors"] == ["", ""] and consumed["poll_errors"] == ["", ""]

    assert per_partition(answer["committed"]) == counts
    assert answer["end_offsets"] == answer["committed"]
    assert answer["group"] == {"state": "Empty", "protocol_type": "consumer", "members": 0,
                               "error": ""}
    resumed = answer["resumed"]  # a new member starts at the committed offsets
    assert resumed["read"] == 10 and resumed["distinct_keys"] == 10
    assert resumed["unexpected"] == 0 and resumed["duplicates"] == 0


def test_franz_go_transactions_commit_and_abort(broker):
    answer = run("franzcheck", broker, "txn", "franz-txn")
    for name, count in (("committed", RECORDS), ("aborted", RECORDS), ("end", 3)):
        assert answer[name] == {"acknowledged": count, "produce_error": "", "end_error": ""}
    assert answer["read_committed"] == {"committed": RECORDS, "end": 3, "distinct": RECORDS + 3}
    assert answer["read_uncommitted"] == {"committed": RECORDS, "aborted": RECORDS, "end": 3,
                                          "distinct": 2 * RECORDS + 3}
    described = answer["described"]
    assert described["state"] == "CompleteCommit" and described["error"] == ""
    assert described["timeout_ms"] == 40000 and described["partitions"] == 0
    assert answer["listed"] == {"state": "CompleteCommit", "producer_id": described["producer_id"]}
    # Partition 0 holds 67 records of each round, 1 end record and 3 markers; its producer's
    # sequence ran through all 135 records and no transaction is open.
    assert answer["producers"] == [{"producer_id": described["producer_id"],
                                    "producer_epoch": described["producer_epoch"],
                                    "last_sequence": 134, "current_txn_start_offset": -1}]
    assert answer["end_offsets"] == {"0": 138, "1": 138, "2": 136}
    assert answer["stable_offsets"] == answer["end_offsets"]


def test_franz_go_group_transact_sessions_copy_each_record_once_across_a_rebalance(broker):
    """Two members copy the input in transactions with the group's offsets; the second joins
    while the first holds a transaction open, which the rebalance must abort."""
    answer = run("franzcheck", broker, "eos", "franz-eos", "-members", "2")
    copied = answer["copied"]
    assert copied["member_errors"] == ["", ""]
    assert copied["committed_records"] == RECORDS  # each record's copy committed once
    held = copied["held"]
    assert held["revoked"] is True and held["committed"] is False and held["records"] > 0
    assert copied["aborted_records"] >= held["records"]
    assert answer["output"] == {"in": RECORDS, "end": 3, "distinct": RECORDS + 3}
    counts = per_partition(answer["produced"]["per_partition"])
    assert per_partition(answer["committed"]) == counts  # the offsets went with the copies
    assert answer["end_offsets"] == answer["committed"]


# --- Sarama ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["default", "max"])
def test_sarama_group_commits_what_it_marked(broker, version):
    """Sarama's own default protocol versions (Kafka 2.8) and the newest it knows."""
    answer = run("saramacheck", broker, "group", f"sarama-{version}", "-version", version,
                 "-members", "2")
    assert answer["version"] == {"default": "2.8.0", "max": "4.3.1"}[version]
    assert answer["create_error"] == ErrorCode.none
    assert answer["create_again_error"] == ErrorCode.topic_already_exists
    assert [(p["partition"], p["leader"], p["replicas"], p["isr"], p["error"])
            for p in answer["describe"]] == [(p, 0, [0], [0], ErrorCode.none) for p in PARTITIONS]
    produced = answer["produced"]
    assert produced["error"] == ErrorCode.none
    counts = per_partition(produced["per_partition"])
    assert sum(counts) == RECORDS and all(counts)
    assert per_partition(produced["last_offset"]) == [count - 1 for count in counts]
    consumed = answer["consumed"]
    assert consumed["distinct_keys"] == RECORDS and consumed["duplicates"] == 0
    held = consumed["assigned_before_produce"]
    assert sorted(p for member in held for p in member) == PARTITIONS and all(held)
    assert consumed["member_errors"] == ["", ""]
    assert per_partition(answer["committed"]) == counts
    assert answer["offset_manager"] == answer["committed"] == answer["end_offsets"]
    assert answer["group"] == {"state": "Empty", "protocol_type": "consumer", "protocol": "",
                               "members": 0, "error": 0}


# --- found by kadm: DeleteTopics names the topic id ------------------------------------------

def ask(broker: BrokerProcess, api_key: int, version: int, values: dict):
    """One request built by kio from `values`, on its own connection; the decoded answer."""
    from tests.wire import request
    from tests.wire import KafkaSocket, decode_response, frame

    with KafkaSocket(("127.0.0.1", broker.port)) as client:
        client.send(frame(request(api_key, version, values)))
        return decode_response(api_key, version, client.receive())[1]


def create_topic(broker: BrokerProcess, name: str) -> uuid.UUID:
    """A topic of one partition, by CreateTopics v7; its id."""
    answer = ask(broker, 19, 7, {"timeout": TIMEOUT, "validate_only": False, "topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}]})
    assert answer.topics[0].error_code == ErrorCode.none
    return answer.topics[0].topic_id


def listed(broker: BrokerProcess, name: str) -> tuple[int, uuid.UUID | None]:
    """(error code, topic id) of one topic in Metadata v12."""
    topic = ask(broker, 3, 12, {"topics": [{"name": name, "topic_id": None}],
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False}).topics[0]
    return topic.error_code, topic.topic_id


TIMEOUT = datetime.timedelta(seconds=5)


def test_delete_topics_by_name_answers_the_deleted_topics_id(broker):
    """Kafka's controller answers a topic deleted by name with its id (v6+), and refuses an
    entry that names both a name and an id, or neither (INVALID_REQUEST)."""
    doomed = create_topic(broker, "doomed-by-name")
    other = create_topic(broker, "named-twice")
    answers = ask(broker, 20, 6, {"timeout": TIMEOUT, "topics": [
        {"name": "doomed-by-name", "topic_id": None},
        {"name": "named-twice", "topic_id": other},
        {"name": None, "topic_id": None},
        {"name": "never-was", "topic_id": None}]}).responses
    found = [(a.name, a.topic_id, a.error_code, a.error_message) for a in answers]
    assert found == [
        ("doomed-by-name", doomed, ErrorCode.none, None),
        ("named-twice", other, 42, "You may not specify both topic name and topic id."),
        (None, None, 42, "Neither topic name nor id were specified."),
        ("never-was", None, 3, None)]
    assert listed(broker, "doomed-by-name") == (3, None)  # UNKNOWN_TOPIC_OR_PARTITION
    assert listed(broker, "named-twice") == (ErrorCode.none, other)  # the malformed entry deleted nothing
