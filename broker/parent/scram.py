"""SCRAM credentials: kept by the parent, salted, in `<first log dir>/.pybroker-scram.json`.

AlterUserScramCredentials brings the salt, the iteration count and the salted password the
client computed; only the stored key and server key derived from it are kept (RFC 5802), never
a password.  The file is written atomically before a change is acknowledged, and every worker
is sent the credentials in force (IPC `Credentials`) after its Boot and after every change.
"""

from __future__ import annotations

import os

import msgspec

from broker.shared.sasl import ScramCredential

STORE_FILE = ".pybroker-scram.json"


class ScramStore:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, STORE_FILE)
        self.users: dict[str, dict[str, ScramCredential]] = {}  # mechanism -> user -> credential

    def load(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                self.users = msgspec.json.decode(
                    handle.read(), type=dict[str, dict[str, ScramCredential]])
        except FileNotFoundError:
            self.users = {}

    def save(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        temporary = self.path + ".tmp"
        # Salted keys are not passwords, but a stolen StoredKey/ServerKey pair lets its holder
        # pose as this broker to a client: readable by the broker's user only.
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
            handle.write(msgspec.json.encode(users))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        self.users = users

    def mechanisms_of(self, user: str) -> list[tuple[str, int]]:
        """(mechanism, iterations) of every credential the user has."""
        return [(mechanism, users[user].iterations)
                for mechanism, users in sorted(self.users.items()) if user in users]
