"""The live connection view's parts without a broker: a worker's bounded answer, the parent's
merge (with a worker that never answers), and the command's table."""

import asyncio
import threading
from types import SimpleNamespace

import pytest

from broker.tools.connections import render
from broker.parent import connection_list
from broker.parent.connection_list import ConnectionListing
from broker.shared import ipc
from workers.top_connections import top_connections
from workers.mute import MuteState


def fake_connection(n: int, closing: bool = False):
    return SimpleNamespace(
        conn_id=n, listener_index=0, ip="10.0.0.1", peer=f"10.0.0.1:{1000 + n}",
        client_id=f"c{n}", principal="User:ANONYMOUS", opened_at=0.0, bytes_in=n,
        bytes_out=2 * n, requests=n % 7, throttle_ms=0, closing=closing,
        state=MuteState.NOT_MUTED, owes_answer=lambda: False, waiting_for=lambda: [])


def test_a_worker_answers_its_top_n_whatever_it_holds():
    connections = [fake_connection(n) for n in range(10_000)]
    connections.append(fake_connection(99_999, closing=True))  # going: neither listed nor counted
    answer = top_connections(connections, ipc.ConnectionsQuery(query=7, top=5, by="bytes"))
    assert answer.query == 7 and answer.total == 10_000
    assert [row.conn_id for row in answer.rows] == [9999, 9998, 9997, 9996, 9995]
    assert answer.rows[0].port == 1000 + 9999 and answer.rows[0].bytes_out == 2 * 9999
    assert ipc.decode(ipc.encode(answer)) == answer  # it crosses the channel as it is
    long_name = fake_connection(1)
    long_name.client_id = "c" * 32767  # a client chooses it: a listing stays small
    [row] = top_connections([long_name], ipc.ConnectionsQuery(query=8, top=1, by="age")).rows
    assert len(row.client_id) == 256 and row.client_id.endswith("…")


class ListedWorker:
    """A worker as the parent's listing sees it: answers a query from its rows, or never."""

    def __init__(self, name: str, listing_of, rows: list | None):
        self.name, self.serving, self._rows, self._listing_of = name, True, rows, listing_of
        self.channel = self

    def send(self, query: ipc.ConnectionsQuery) -> None:
        if self._rows is None:
            return  # a worker too busy (or wedged) to answer
        listing = self._listing_of()
        answer = ipc.ConnectionsList(query=query.query, total=len(self._rows),
                                     rows=self._rows[:query.top])
        listing.loop.call_soon(listing.answered, self, answer)


def row(conn_id: int, requests: int) -> ipc.ConnectionRow:
    return ipc.ConnectionRow(conn_id=conn_id, listener=1, ip="10.0.0.2", port=5, client_id=None,
                             principal="User:ANONYMOUS", age_s=1.0, bytes_in=0, bytes_out=0,
                             requests=requests, in_flight=0, throttle_ms=0, state="not_muted",
                             waiting_for=[])


@pytest.fixture
def loop():
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(5)
    running.close()


def test_the_parent_merges_the_top_n_and_names_a_worker_that_did_not_answer(loop, monkeypatch):
    monkeypatch.setattr(connection_list, "ANSWER_TIMEOUT", 0.2)
    holder = {}

    def listing_of():
        return holder["listing"]

    workers = [ListedWorker("data-0", listing_of, [row(1, 50), row(2, 10)]),
               ListedWorker("data-1", listing_of, [row(3, 40), row(4, 30)]),
               ListedWorker("control-0", listing_of, None)]
    listing = holder["listing"] = ConnectionListing(loop, workers, ["PLAINTEXT", "CONTROLLER"])
    answer = listing.ask(top=3, by="requests")
    assert [(item["worker"], item["conn_id"]) for item in answer["rows"]] == \
        [("data-0", 1), ("data-1", 3), ("data-1", 4)]
    assert answer["connections"] == 4 and answer["workers"] == {"data-0": 2, "data-1": 2}
    assert answer["unanswered"] == ["control-0"]
    assert answer["rows"][0]["listener"] == "CONTROLLER"
    with pytest.raises(ValueError, match="by must be one of"):
        listing.ask(top=3, by="size")
    with pytest.raises(ValueError, match="top must be"):
        listing.ask(top=connection_list.MAX_TOP + 1)


def test_the_command_prints_a_line_per_connection_and_the_totals():
    answer = {"by": "bytes", "top": 2, "connections": 7, "workers": {"data-0": 4, "data-1": 3},
              "unanswered": ["control-0"], "rows": [{
                  "worker": "data-0", "listener": "PLAINTEXT", "ip": "10.1.2.3", "port": 4444,
                  "client_id": None, "principal": "User:alice", "age_s": 3725.0,
                  "bytes_in": 1_234_567, "bytes_out": 999, "requests": 12_345, "in_flight": 1,
                  "throttle_ms": 2500, "state": "throttled", "waiting_for": ["throttle"]}]}
    lines = render(answer).splitlines()
    assert lines[1].split() == ["data-0", "PLAINTEXT", "10.1.2.3:4444", "-", "User:alice",
                                "1h02m", "1.2M", "999", "12.3k", "1", "2.5s", "throttle"]
    assert lines[2] == "7 connections (data-0 4, data-1 3); top 2 by bytes"
    assert lines[3] == "no answer in time from: control-0"
