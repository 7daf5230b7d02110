"""TLS server contexts, reloadable in place (SIGHUP) without dropping connections."""
from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from settings import ListenerConfig
log = logging.getLogger(__name__)


def make_context(listener: ListenerConfig) -> ssl.SSLContext:
    """listener: a settings.ListenerConfig of type tls or wss."""
    if not listener.certfile:
        raise ValueError(f"TLS listener on port {listener.port} needs certfile (and keyfile)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if listener.type == "wss":
        # no TLS 1.3 session tickets on WebSocket listeners: with them, a client's upgrade
        # request sent right after the handshake was, now and then, never read (the client
        # waited 10 s for the 101 and gave up; 4 of 30 runs of tests/integration/
        # test_tls_identity.py -k wss, 0 of 35 without them). The cost: a reconnecting client
        # makes a full handshake. Plain TLS listeners keep them (no such hang seen).
        ctx.num_tickets = 0
    load(ctx, listener)
    return ctx


def load(ctx: ssl.SSLContext, listener: ListenerConfig) -> None:
    """(Re)load certificates into ctx; new handshakes use them, open connections are untouched."""
    try:
        ctx.load_cert_chain(listener.certfile, listener.keyfile or None)
        cafile = listener.cafile
        if cafile:
            ctx.load_verify_locations(cafile)
        ctx.verify_mode = (ssl.CERT_REQUIRED if listener.require_client_cert
                           else ssl.CERT_OPTIONAL if cafile else ssl.CERT_NONE)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load TLS certificate {listener.certfile}: {exc}") from None


def peer_identity(ssl_object: ssl.SSLObject | None) -> str | None:
    """The common name (else the first subject alternative name) of a verified client certificate."""
    if ssl_object is None:
        return None
    cert: dict[str, Any] | None = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    for kind, value in cert.get("subjectAltName", ()):  # no CN: the first name it carries
        return value
    return None


def listener_identity(listener: ListenerConfig, ssl_object: ssl.SSLObject | None) -> str | None:
    """What Connection.identity must be for a socket on this listener: None when the listener
    does not use certificates as user names, else the certificate's name, or "" when the client
    showed no verified certificate (the CONNECT is then refused, never trusted as claimed)."""
    if not listener.use_identity_as_username:
        return None
    return peer_identity(ssl_object) or ""
