"""SASL authentication of one connection on a SASL_PLAINTEXT or SASL_SSL listener.

Until the client has authenticated, the connection's requests come here instead of to the
router (workers.router): ApiVersions is answered, SaslHandshake picks a mechanism,
SaslAuthenticate carries its tokens (PLAIN: one; SCRAM: two rounds through `scramp`), and any
other request closes the connection, as Kafka does.  After SaslHandshake v0 the tokens come
raw, without a Kafka header.  On success the connection's principal becomes `User:<name>` and
its requests go to the router from then on; with `connections.max.reauth.ms` (KIP-368) the
session has that lifetime, a SaslHandshake on the connection starts a new exchange (at most one
a second; the same mechanism and the same principal only, else it fails), and the worker closes
sessions left to expire.  On failure, or a SASL request out of order, the answer goes out at
once and the connection is closed `connection.failed.authentication.delay.ms` later, on a
timer: nothing waits, neither the acceptor nor the worker.

A successful exchange is not answered at once: the parent, which counts connections per
principal across all workers, must first admit the user (`claim`, the per-user count and
creation rate).  Until its verdict the connection stays parked; refused, it gets the
authentication failure and is closed after the same delay.  A re-authentication (same
principal, same connection) is not asked again.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import logging
import struct
import time
from typing import Callable

from scramp import ScramException, ScramMechanism

from broker.shared.apis import api_key_of
from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
from broker.shared.protocol.context import RequestContext
from broker.shared.protocol.errors import ErrorCode
from broker.shared.sasl import SaslSettings, ScramCredential
from workers.router import InvalidRequest
from workers.unknown_tags import is_unknown_tag, without_unknown_tags

log = logging.getLogger("workers.authenticator")

_SASL_HANDSHAKE, _SASL_AUTHENTICATE, _API_VERSIONS = 17, 36, 18
_INT32 = struct.Struct(">i")
_NO_REAUTH = datetime.timedelta(0)  # no session lifetime: re-authentication is not asked
_REAUTH_INTERVAL = 1.0  # seconds: at most one re-authentication a second, as Kafka's channel
FAILED = "Authentication failed: invalid username or password"


class Authenticator:
    """The requests of one connection before it authenticated (the connection's `_handle`)."""

    def __init__(self, conn, settings: SaslSettings,
                 credentials: Callable[[str, str], ScramCredential | None],
                 router_handle, on_result, failure_delay: float, reauth_ms: int = 0,
                 claim=None):
        self.conn = conn
        self.settings = settings
        self._credentials = credentials  # (mechanism, user) -> the stored SCRAM credential
        self._router_handle = router_handle
        self._on_result = on_result  # (authenticator, mechanism, user, result) -> None
        # (conn, user) -> a Future of the parent's ipc.UserVerdict; None: admit at once
        self._claim = claim
        self._claimed: tuple[str, asyncio.Future] | None = None  # an admission being asked
        self._failure_delay = failure_delay
        # KIP-368: sessions last reauth_ms (connections.max.reauth.ms), then the client must
        # authenticate again on the same connection, as the same principal; 0: for ever.
        self.reauth_ms = reauth_ms
        self._lifetime = datetime.timedelta(milliseconds=reauth_ms)
        self._reauthenticating = False
        self._reauth_started = -_REAUTH_INTERVAL  # monotonic time the last one began
        self._session_mechanism: str | None = None  # the mechanism the session began with
        self.mechanism: str | None = None
        self._raw_tokens = False  # SaslHandshake v0: tokens follow without a Kafka header
        self._scram = None  # scramp's server side of the exchange, once it began
        self._scram_user: str | None = None  # the user name the SCRAM client gave
        self._failed = False
        self.user: str | None = None

    def handle(self, request, listener: int, *_connection):
        """Answer a request of the connection (whose user and address it knows itself)."""
        if self.user is not None and not self._reauthenticating:  # authenticated
            # KIP-368: only a SaslHandshake begins a re-authentication, and at most one a
            # second; any other SASL request goes to the router, which refuses it.
            if not (self.reauth_ms and len(request) >= 8
                    and api_key_of(request) == _SASL_HANDSHAKE and self._may_reauthenticate()):
                return self._router_handle(request, listener, self.user, self.conn.ip,
                                           self.conn)
            self._begin_reauthentication()
        if self._failed:
            return None  # closing after the delay: nothing more is answered
        if self._raw_tokens:
            return self._raw_token(bytes(request))
        if len(request) < 8:
            raise InvalidRequest("frame_too_small", f"request of {len(request)} bytes")
        api_key = api_key_of(request)
        if api_key == _API_VERSIONS:
            return self._router_handle(request, listener, self.user or "ANONYMOUS",
                                       self.conn.ip, self.conn)
        if api_key == _SASL_HANDSHAKE:
            return self._handshake(*self._decode(request, listener))
        if api_key == _SASL_AUTHENTICATE:
            ctx, body = self._decode(request, listener)
            token, code, message = self._token(bytes(body.auth_bytes))
            if self._claimed is not None:
                return self._after_verdict(lambda refusal: ctx.respond(
                    {"error_code": ErrorCode.sasl_authentication_failed,
                     "error_message": refusal, "auth_bytes": b"", "session_lifetime": _NO_REAUTH}
                    if refusal else {"error_code": ErrorCode.none, "error_message": None,
                                     "auth_bytes": token, "session_lifetime": self._lifetime}))
            lifetime = self._lifetime if code == ErrorCode.none and self.user else _NO_REAUTH
            return ctx.respond({"error_code": code, "error_message": message,
                                "auth_bytes": token, "session_lifetime": lifetime})
        raise InvalidRequest("not_authenticated",
                             f"API key {api_key} before SASL authentication")

    @staticmethod
    def _decode(request, listener: int):
        api_key, version, _ = REQUEST_PREFIX.unpack_from(request, 0)
        try:
            header_reader, body_reader = request_readers(api_key, version)
            try:
                header, offset = header_reader(request, 0)
                body, _ = body_reader(request, offset)
            except KeyError as error:  # a newer client's tagged fields: skipped (KIP-482)
                if not is_unknown_tag(error):
                    raise
                request = without_unknown_tags(request, api_key, version)
                header, offset = header_reader(request, 0)
                body, _ = body_reader(request, offset)
        except Exception as error:  # kio raises several types for malformed input
            raise InvalidRequest("malformed_body", f"bad SASL request: {error!r}") from None
        return RequestContext(request[4:8], api_key, version, listener, header), body

    def _handshake(self, ctx: RequestContext, body) -> bytes:
        """The mechanism for the exchange.  A second handshake or a mechanism not enabled is
        answered, then the connection is closed, as Kafka does.  A re-authentication's
        handshake is answered even with another mechanism: the exchange fails on its first
        token (Kafka's REAUTH_BAD_MECHANISM)."""
        enabled = list(self.settings.mechanisms)
        if self.mechanism is not None:
            code = self._refuse(ErrorCode.illegal_sasl_state,
                                "a SaslHandshake during an exchange")[1]
        elif body.mechanism not in enabled:
            code = self._refuse(ErrorCode.unsupported_sasl_mechanism,
                                f"SASL mechanism {body.mechanism[:64]!r} is not enabled")[1]
        else:
            code = ErrorCode.none
            self.mechanism = body.mechanism
            self._raw_tokens = ctx.version == 0
        return ctx.respond({"error_code": code, "mechanisms": enabled})

    def _raw_token(self, token: bytes):
        reply, code, _message = self._token(token)
        if code != ErrorCode.none:
            return None  # v0 has no error frame: the connection closes after the delay
        framed = _INT32.pack(len(reply)) + reply
        if self._claimed is not None:
            return self._after_verdict(lambda refusal: None if refusal else framed)
        return framed

    def _token(self, token: bytes):
        """(reply token, error code, error message) for one client token."""
        if self.mechanism is None:
            return self._refuse(ErrorCode.illegal_sasl_state,
                                "a SASL token before SaslHandshake")
        if self._reauthenticating and self.mechanism != self._session_mechanism:
            return self._fail(self.user, f"SASL mechanism '{self.mechanism}' requested by client "
                                         f"is not supported for re-authentication of mechanism "
                                         f"'{self._session_mechanism}'")
        if self.mechanism == "PLAIN":
            return self._plain(token)
        return self._scram_step(token)

    def _plain(self, token: bytes):
        parts = token.split(b"\x00")
        if len(parts) != 3:
            return self._fail(None, "malformed PLAIN token")
        authorization, user, password = (part.decode("utf-8", "replace") for part in parts)
        expected = self.settings.plain_users.get(user)
        # compare_digest: the time taken does not tell how much of a guess was right
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()) \
                or authorization not in ("", user):
            return self._fail(user, FAILED)
        return self._succeed(user)

    def _scram_step(self, token: bytes):
        try:
            if self._scram is None:
                self._scram = ScramMechanism(self.mechanism).make_server(self._scram_auth_info)
                self._scram.set_client_first(token.decode("utf-8"))
                return self._scram.get_server_first().encode(), ErrorCode.none, None
            self._scram.set_client_final(token.decode("utf-8"))
            final = self._scram.get_server_final().encode()
        except (ScramException, UnicodeDecodeError, ValueError) as error:
            log.debug("SCRAM exchange failed: %s", error)
            return self._fail(self._scram_user, FAILED)
        _empty, code, message = self._succeed(self._scram_user)
        return final, code, message

    def _scram_auth_info(self, user: str):
        self._scram_user = user
        credential = self._credentials(self.mechanism, user)
        if credential is None:
            raise ScramException("unknown user")
        return credential.salt, credential.stored_key, credential.server_key, \
            credential.iterations

    def _may_reauthenticate(self) -> bool:
        now = time.monotonic()
        if now - self._reauth_started < _REAUTH_INTERVAL:
            return False
        self._reauth_started = now
        return True

    def _begin_reauthentication(self) -> None:
        """A SaslHandshake on an authenticated connection: a new exchange, which must use the
        session's mechanism and end with the same principal."""
        self._reauthenticating = True
        self.mechanism, self._raw_tokens, self._scram, self._scram_user = None, False, None, None

    def _succeed(self, user: str):
        if self._reauthenticating and user != self.user:
            return self._fail(user, "re-authentication as another user is not allowed")
        if self._reauthenticating or self._claim is None:
            self._admitted(user)
        else:  # the answer waits for the parent's verdict on the user's limits
            self._claimed = (user, self._claim(self.conn, user))
        return b"", ErrorCode.none, None

    def _admitted(self, user: str) -> None:
        self.user, self._reauthenticating = user, False
        self._session_mechanism = self.mechanism
        self._on_result(self, self.mechanism, user, "success")

    def _after_verdict(self, respond) -> asyncio.Future:
        """The answer to the last token, once the parent admitted or refused the user:
        `respond(refusal)` makes it, refusal being "" or the client's error message."""
        (user, verdict), self._claimed = self._claimed, None
        answer = verdict.get_loop().create_future()

        def decided(done: asyncio.Future) -> None:
            if answer.done():  # the connection closed meanwhile
                return
            if done.exception() is not None:
                answer.set_exception(done.exception())
                return
            refused = done.result().refused
            if refused:
                self._failed = True
                self._on_result(self, self.mechanism, user, refused)  # closes it later
                answer.set_result(respond(refusal_message(user, done.result())))
                return
            self._admitted(user)
            answer.set_result(respond(""))

        verdict.add_done_callback(decided)
        return answer

    def _fail(self, user: str | None, message: str):
        """The exchange failed: (reply token, error code, `message`) for the answer; nothing
        more is answered and the connection closes after the failed-authentication delay."""
        self._failed = True
        self._on_result(self, self.mechanism, user, "failure")
        self.conn.close_later(self._failure_delay, "authentication_failed")
        return b"", ErrorCode.sasl_authentication_failed, message

    def _refuse(self, code: int, message: str):
        """A SASL request out of the protocol's order: answered with `code`, then, as Kafka
        does, the connection closes (after the same delay)."""
        self._failed = True
        log.info("SASL from %s: %s; closing the connection", self.conn.ip, message)
        self.conn.close_later(self._failure_delay, "authentication_failed")
        return b"", code, message


def refusal_message(user: str, verdict) -> str:
    """What a client refused by the per-user limits is told (its ipc.UserVerdict)."""
    if verdict.refused == "per_user_rate":
        return (f"Connection creation rate of user {user} is over its limit of "
                f"{verdict.limit}/s (pybroker.max.connection.creation.rate.per.user)")
    return (f"Connection limit of user {user} reached: {verdict.limit} "
            f"(pybroker.max.connections.per.user)")
