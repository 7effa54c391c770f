"""SASL authentication of one connection on a SASL_PLAINTEXT or SASL_SSL listener.

Until the client has authenticated, the connection's requests come here instead of to the
router (workers.handlers): ApiVersions is answered, SaslHandshake picks a mechanism,
SaslAuthenticate carries its tokens (PLAIN: one; SCRAM: two rounds through `scramp`), and any
other request closes the connection, as Kafka does.  After SaslHandshake v0 the tokens come
raw, without a Kafka header.  On success the connection's principal becomes `User:<name>` and
its requests go to the router from then on; with `connections.max.reauth.ms` (KIP-368) the
session has that lifetime, a SaslHandshake on the connection starts a new exchange (the same
principal only), and the worker closes sessions left to expire.  On failure the answer goes out at once and the
connection is closed `connection.failed.authentication.delay.ms` later, on a timer: nothing
waits, neither the acceptor nor the worker.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import struct
from typing import Callable

from scramp import ScramException, ScramMechanism

from broker.shared.apis import api_key_of
from broker.shared.protocol import errors
from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
from broker.shared.protocol.context import RequestContext
from broker.shared.sasl import SaslSettings, ScramCredential
from workers.handlers import InvalidRequest

log = logging.getLogger("workers.authenticator")

_SASL_HANDSHAKE, _SASL_AUTHENTICATE, _API_VERSIONS = 17, 36, 18
_INT32 = struct.Struct(">i")
_NO_REAUTH = datetime.timedelta(0)  # no session lifetime: re-authentication is not asked
FAILED = "Authentication failed: invalid username or password"


class Authenticator:
    """The requests of one connection before it authenticated (the connection's `_handle`)."""

    def __init__(self, conn, settings: SaslSettings,
                 credentials: Callable[[str, str], ScramCredential | None],
                 router_handle, on_result, failure_delay: float, reauth_ms: int = 0):
        self.conn = conn
        self.settings = settings
        self._credentials = credentials  # (mechanism, user) -> the stored SCRAM credential
        self._router_handle = router_handle
        self._on_result = on_result  # (authenticator, mechanism, user, ok) -> None
        self._failure_delay = failure_delay
        # KIP-368: sessions last reauth_ms (connections.max.reauth.ms), then the client must
        # authenticate again on the same connection, as the same principal; 0: for ever.
        self.reauth_ms = reauth_ms
        self._lifetime = datetime.timedelta(milliseconds=reauth_ms)
        self._reauthenticating = False
        self.mechanism: str | None = None
        self._raw_tokens = False  # SaslHandshake v0: tokens follow without a Kafka header
        self._scram = None  # scramp's server side of the exchange, once it began
        self._scram_user: str | None = None  # the user name the SCRAM client gave
        self._failed = False
        self.user: str | None = None

    def handle(self, request, listener: int):
        if self.user is not None and not self._reauthenticating:  # authenticated
            if not (self.reauth_ms and len(request) >= 8
                    and api_key_of(request) in (_SASL_HANDSHAKE, _SASL_AUTHENTICATE)):
                return self._router_handle(request, listener, self.user)
            self._begin_reauthentication()
        if self._failed:
            return None  # closing after the delay: nothing more is answered
        if self._raw_tokens:
            return self._raw_token(bytes(request))
        if len(request) < 8:
            raise InvalidRequest("frame_too_small", f"request of {len(request)} bytes")
        api_key = api_key_of(request)
        if api_key == _API_VERSIONS:
            return self._router_handle(request, listener, self.user or "ANONYMOUS")
        if api_key == _SASL_HANDSHAKE:
            return self._handshake(*self._decode(request, listener))
        if api_key == _SASL_AUTHENTICATE:
            ctx, body = self._decode(request, listener)
            token, code, message = self._token(bytes(body.auth_bytes))
            lifetime = self._lifetime if code == errors.NONE and self.user else _NO_REAUTH
            return ctx.respond({"error_code": code, "error_message": message,
                                "auth_bytes": token, "session_lifetime": lifetime})
        raise InvalidRequest("not_authenticated",
                             f"API key {api_key} before SASL authentication")

    @staticmethod
    def _decode(request, listener: int):
        api_key, version, _ = REQUEST_PREFIX.unpack_from(request, 0)
        try:
            header_reader, body_reader = request_readers(api_key, version)
            header, offset = header_reader(request, 0)
            body, _ = body_reader(request, offset)
        except Exception as error:  # kio raises several types for malformed input
            raise InvalidRequest("malformed_body", f"bad SASL request: {error!r}") from None
        return RequestContext(request[4:8], api_key, version, listener, header), body

    def _handshake(self, ctx: RequestContext, body) -> bytes:
        enabled = list(self.settings.mechanisms)
        if self.mechanism is not None:
            code = errors.ErrorCode.illegal_sasl_state
        elif body.mechanism not in enabled:
            code = errors.ErrorCode.unsupported_sasl_mechanism
        else:
            code = errors.NONE
            self.mechanism = body.mechanism
            self._raw_tokens = ctx.version == 0
        return ctx.respond({"error_code": code, "mechanisms": enabled})

    def _raw_token(self, token: bytes) -> bytes | None:
        reply, code, _message = self._token(token)
        if code != errors.NONE:
            return None  # v0 has no error frame: the connection closes after the delay
        return _INT32.pack(len(reply)) + reply

    def _token(self, token: bytes):
        """(reply token, error code, error message) for one client token."""
        if self.mechanism is None:
            return b"", errors.ErrorCode.illegal_sasl_state, "SaslHandshake first"
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
                return self._scram.get_server_first().encode(), errors.NONE, None
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

    def _begin_reauthentication(self) -> None:
        """A SaslHandshake or SaslAuthenticate on an authenticated connection: a new exchange,
        which must end with the same principal."""
        self._reauthenticating = True
        self.mechanism, self._raw_tokens, self._scram, self._scram_user = None, False, None, None

    def _succeed(self, user: str):
        if self._reauthenticating and user != self.user:
            return self._fail(user, "re-authentication as another user is not allowed")
        self.user, self._reauthenticating = user, False
        self._on_result(self, self.mechanism, user, True)
        return b"", errors.NONE, None

    def _fail(self, user: str | None, message: str):
        self._failed = True
        self._on_result(self, self.mechanism, user, False)
        self.conn.close_later(self._failure_delay, "authentication_failed")
        return b"", errors.ErrorCode.sasl_authentication_failed, message
