"""SaslHandshake and SaslAuthenticate where no authentication is going on: on a listener
without SASL, or after the connection authenticated (a SaslAuthenticate outside an exchange, or
any SASL request when no re-authentication (KIP-368) may begin: none is offered, or one began
less than a second ago).  Kafka answers ILLEGAL_SASL_STATE; the exchange itself is
workers.authenticator's."""

from __future__ import annotations

import datetime

from broker.shared.protocol.errors import ErrorCode
from workers.router import Api, RequestContext

_NO_REAUTH = datetime.timedelta(0)  # no session lifetime: re-authentication is not asked
_ILLEGAL = ErrorCode.illegal_sasl_state


class SaslHandshake(Api, api="SaslHandshake"):
    def handle(self, ctx: RequestContext, body) -> bytes:
        return ctx.respond({"error_code": _ILLEGAL, "mechanisms": []})


class SaslAuthenticate(Api, api="SaslAuthenticate"):
    def handle(self, ctx: RequestContext, body) -> bytes:
        return ctx.respond({"error_code": _ILLEGAL, "error_message":
                            "no SASL authentication is in progress on this connection",
                            "auth_bytes": b"", "session_lifetime": _NO_REAUTH})
