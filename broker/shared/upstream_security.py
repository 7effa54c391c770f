"""Front-end mode: how this broker connects to the upstream cluster, as a client of its own.

`pybroker.upstream.security.protocol` is Kafka's client setting: PLAINTEXT, SSL,
SASL_PLAINTEXT or SASL_SSL.  `UpstreamSecurity` holds the TLS context (trusting
`pybroker.upstream.ssl.ca.location`, or the system's CAs; the host name checked unless
`pybroker.upstream.ssl.endpoint.identification.algorithm` is empty) and runs the SASL
exchange (PLAIN, or SCRAM-SHA-256/512 through scramp) with the front-end's own credentials on
a fresh connection, before any client's request: the upstream sees one identity, the
front-end's.  Both the parent (its look at the cluster) and the workers (their links) use it.
"""

from __future__ import annotations

import ssl
from typing import Awaitable, Callable

from broker.shared.protocol.client_codec import decode_response, request_frame

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HANDSHAKE, _AUTHENTICATE = 17, 36
_HANDSHAKE_VERSION, _AUTHENTICATE_VERSION = 1, 2
CLIENT_ID = "pybroker-frontend"


class UpstreamAuthenticationError(OSError):
    """The upstream refused the front-end's credentials, or the exchange went wrong."""


class UpstreamSecurity:
    """The front-end's TLS and SASL toward the upstream; validated in the constructor."""

    def __init__(self, protocol: str, mechanism: str = "PLAIN", username: str = "",
                 password: str = "", ca_location: str = "", check_host: bool = True):
        if protocol not in PROTOCOLS:
            raise ValueError(f"pybroker.upstream.security.protocol: {protocol!r} (one of "
                             f"{', '.join(PROTOCOLS)})")
        self.sasl = protocol.startswith("SASL_")
        if self.sasl and mechanism not in MECHANISMS:
            raise ValueError(f"pybroker.upstream.sasl.mechanism: {mechanism!r} (one of "
                             f"{', '.join(MECHANISMS)})")
        if self.sasl and not (username and password):
            raise ValueError(f"pybroker.upstream.sasl.username and .password: both needed "
                             f"with {protocol}")
        self.protocol, self.mechanism = protocol, mechanism
        self.username, self.password = username, password
        self.check_host = check_host
        self.context: ssl.SSLContext | None = None
        if protocol.endswith("SSL"):
            self.context = ssl.create_default_context(cafile=ca_location or None)
            self.context.check_hostname = check_host

    @classmethod
    def of(cls, props) -> UpstreamSecurity:
        return cls(props.pybroker_upstream_security_protocol,
                   props.pybroker_upstream_sasl_mechanism, props.pybroker_upstream_sasl_username,
                   props.pybroker_upstream_sasl_password, props.pybroker_upstream_ssl_ca_location,
                   props.pybroker_upstream_ssl_endpoint_identification_algorithm != "")

    def connection_options(self, host: str) -> dict:
        """Keyword arguments of loop.create_connection / asyncio.open_connection."""
        if self.context is None:
            return {}
        return {"ssl": self.context, "server_hostname": host if self.check_host else ""}

    async def authenticate(self, ask: Callable[[bytes], Awaitable[bytes]]) -> float:
        """The SASL exchange over a fresh connection; `ask(request frame)` answers the
        response frame (both size-prefixed).  The seconds the session lasts (KIP-368: the
        upstream closes the connection then), 0 for ever.  UpstreamAuthenticationError if
        refused."""
        if not self.sasl:
            return 0.0
        handshake = decode_response(_HANDSHAKE, _HANDSHAKE_VERSION, await ask(request_frame(
            _HANDSHAKE, _HANDSHAKE_VERSION, 1, CLIENT_ID, {"mechanism": self.mechanism})))[1]
        if handshake.error_code != 0:
            raise UpstreamAuthenticationError(
                f"upstream SASL handshake: {handshake.error_code.name} (it offers "
                f"{', '.join(handshake.mechanisms)})")
        if self.mechanism == "PLAIN":
            return (await self._round(ask, f"\0{self.username}\0{self.password}".encode(),
                                      2))[1]
        from scramp import ScramClient

        client = ScramClient([self.mechanism], self.username, self.password)
        server_first, _ = await self._round(ask, client.get_client_first().encode(), 2)
        try:
            client.set_server_first(server_first.decode())
            server_final, lifetime = await self._round(ask, client.get_client_final().encode(),
                                                       3)
            client.set_server_final(server_final.decode())
        except UpstreamAuthenticationError:
            raise
        except Exception as error:  # noqa: BLE001 - scramp's own exception types
            raise UpstreamAuthenticationError(f"upstream SCRAM: {error}") from None
        return lifetime

    async def _round(self, ask, token: bytes, correlation: int) -> tuple[bytes, float]:
        """One SaslAuthenticate: (the server's token, the session's seconds or 0)."""
        answer = decode_response(_AUTHENTICATE, _AUTHENTICATE_VERSION, await ask(request_frame(
            _AUTHENTICATE, _AUTHENTICATE_VERSION, correlation, CLIENT_ID,
            {"auth_bytes": token})))[1]
        if answer.error_code != 0:
            raise UpstreamAuthenticationError(
                f"upstream SASL {self.mechanism} as {self.username}: "
                f"{answer.error_code.name} ({answer.error_message})")
        return answer.auth_bytes, max(0.0, answer.session_lifetime.total_seconds())
