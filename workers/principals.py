"""Who a connection is, inside a worker: the principal of a client certificate (SSL
listeners, through ssl.principal.mapping.rules), the SASL exchange of a SASL listener (PLAIN,
SCRAM, KIP-368 re-authentication) and the parent's verdict on the per-user limits, which are
counted across workers.

A connection asks through its host (workers.worker.Worker, a ConnectionHost), which hands the
questions to the worker's `Principals`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from broker.shared import ipc
from broker.shared.config import BrokerConfig
from broker.shared.sasl import ScramCredential
from broker.shared.tls import ANONYMOUS, PrincipalRules, certificate_principal
from workers.authenticator import Authenticator

log = logging.getLogger("workers.principals")


class Principals:
    """The principals of one worker's connections and the per-user verdicts it waits for."""

    def __init__(self, config: BrokerConfig, channel: ipc.Channel, control_plane: bool,
                 router_handle, stats, events=None):
        props = config.props
        self.channel = channel
        self.control_plane = control_plane  # outside the data plane's per-user limits
        self.router_handle = router_handle  # what answers a connection once authenticated
        self.stats = stats
        self.events = events  # workers.worker_events.WorkerEvents, or None
        self._sasl = [config.listener_sasl.get(item.name) for item in config.listeners]
        self.scram: dict[str, dict[str, ScramCredential]] = {}  # from the parent
        self.failed_delay = props.connection_failed_authentication_delay_ms / 1000
        self._reauth_ms = props.connections_max_reauth_ms
        # SSL listeners only: on SASL_SSL, as in Kafka, SASL names the principal.
        self._rules = [
            None if (settings := config.listener_tls.get(item.name)) is None
            or item.protocol != "SSL"
            else PrincipalRules(settings.get("ssl.principal.mapping.rules", "DEFAULT"))
            for item in config.listeners]
        self._claims: dict[int, asyncio.Future] = {}  # conn id -> the parent's UserVerdict

    def principal_of(self, listener: int, transport) -> str:
        """The connection's principal: on an SSL listener with a verified client certificate,
        its subject through ssl.principal.mapping.rules (CertificateRefused when it names no
        one); else User:ANONYMOUS."""
        rules = self._rules[listener]
        if rules is None or not transport.get_extra_info("peercert"):
            return ANONYMOUS
        return certificate_principal(
            rules, transport.get_extra_info("ssl_object").getpeercert(binary_form=True))

    def authenticator(self, conn) -> Authenticator | None:
        """On a SASL listener, what serves the connection until it authenticated."""
        settings = self._sasl[conn.listener_index]
        if settings is None:
            return None
        return Authenticator(conn, settings, self._scram_credential, self.router_handle,
                             self._authentication_result, self.failed_delay, self._reauth_ms,
                             claim=self.claim_user)

    def _scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        return self.scram.get(mechanism, {}).get(user)

    def _authentication_result(self, authenticator: Authenticator, mechanism: str,
                               user: str | None, result: str) -> None:
        """result: success, failure, or the per-user limit that refused the user."""
        conn = authenticator.conn
        self.stats.authentication(conn.listener_index, mechanism,
                                  result if result in ("success", "failure") else "refused")
        if result == "success" and authenticator.reauth_ms:  # it watches for re-authentication
            conn.authenticated(f"User:{user}", authenticator.handle)
            conn.session_expires = time.monotonic() + authenticator.reauth_ms / 1000
            return
        if result == "success":
            conn.authenticated(f"User:{user}", self.router_handle)
            return
        if result != "failure":
            self.user_refused(conn, user, result)
            return
        log.info("connection %s from %s: %s authentication failed for user %r; closing in "
                 "%d ms", conn.conn_id, conn.peer, mechanism, user, self.failed_delay * 1000)
        if self.events is not None:
            self.events.authentication_failed(conn, mechanism, user)

    def claim_user(self, conn, user: str) -> asyncio.Future:
        """Ask the parent whether `conn`, authenticated as `user`, may stay: the per-user
        limits are counted there, across all workers.  A Future of the ipc.UserVerdict."""
        future = asyncio.get_running_loop().create_future()
        if self.control_plane:  # outside the data plane's limits, as for per-IP ones
            future.set_result(ipc.UserVerdict(conn_id=conn.conn_id))
            return future
        self._claims[conn.conn_id] = future
        try:
            self.channel.send(ipc.UserClaim(conn_id=conn.conn_id, user=user))
        except OSError as error:
            self._claims.pop(conn.conn_id, None)
            if not future.done():  # fail_claims may have failed it already
                future.set_exception(error)
        return future

    def verdict(self, verdict: ipc.UserVerdict) -> None:
        future = self._claims.pop(verdict.conn_id, None)
        if future is not None and not future.done():
            future.set_result(verdict)

    def user_refused(self, conn, user: str, reason: str) -> None:
        """The parent refused an authenticated connection for its user's limits (`reason`
        per_user_limit or per_user_rate): close it after the failed-authentication delay."""
        log.info("connection %s from %s: user %r is over its %s; closing in %d ms",
                 conn.conn_id, conn.peer, user,
                 "connection limit" if reason == "per_user_limit" else "connection creation rate",
                 self.failed_delay * 1000)
        conn.close_later(self.failed_delay, reason)

    def fail_claims(self, error: BaseException) -> None:
        """The parent is gone: no verdict will come."""
        for future in self._claims.values():
            if not future.done():
                future.set_exception(error)
        self._claims.clear()
