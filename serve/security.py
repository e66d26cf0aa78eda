"""Start-up checks of the server's security settings: refuse to start rather than serve unprotected.

:func:`check_security_config` is called by :class:`serve.server.GnnServer` before anything binds
(so the CLI, :class:`serve.server.BackgroundServer` and any embedding are covered) and by
``gnnserve serve`` before it loads anything (which reports ``gnnserve serve: <message>`` and exits 2).
:func:`resolve_token` reads the bearer token from ``--token-file``, ``$GNNSERVE_TOKEN_FILE`` or
``$GNNSERVE_TOKEN``. Both raise :class:`SecurityConfigError`. Refused:

* an empty or blank token (file, ``$GNNSERVE_TOKEN_FILE`` or ``$GNNSERVE_TOKEN`` set but blank), an
  unreadable token file, a token with characters gRPC metadata cannot carry;
* half-configured TLS: a certificate without its key (or the reverse), a client CA without a server
  certificate and key, an unreadable or non-PEM certificate, key or CA file;
* a bind address other than loopback with neither a bearer token nor client certificates (mutual
  TLS), unless ``insecure`` is set (``--insecure``): then the server starts and logs a warning.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SecurityConfigError", "check_security_config", "is_loopback", "read_token_file", "resolve_token"]

TOKEN_ENV = "GNNSERVE_TOKEN"
TOKEN_FILE_ENV = "GNNSERVE_TOKEN_FILE"


class SecurityConfigError(ValueError):
    """A security setting that would leave the server open or half-protected; the message says which."""


def is_loopback(host: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8``, ``::1`` (also bracketed) and IPv4-mapped loopback.

    Anything else, an unknown host name or ``""`` included, counts as reachable from outside.
    """
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _check_token_value(token: str, source: str) -> str:
    if not token.strip():
        raise SecurityConfigError(f"{source} is empty or blank: refusing to start without a usable bearer token")
    token = token.strip()
    if any(not (0x20 <= ord(c) < 0x7F) for c in token):
        raise SecurityConfigError(f"{source} holds characters a gRPC header cannot carry (control or non-ASCII "
                                  "characters): no client could send this token")
    return token


def read_token_file(path: str | os.PathLike[str], source: str = "--token-file") -> str:
    """The token in ``path`` without surrounding whitespace; refuses an unreadable or blank file."""
    label = f"{source} {str(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SecurityConfigError(f"cannot read {label}: {reason}") from None
    return _check_token_value(text, label)


def resolve_token(token_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token to require, or ``None`` for none.

    In order: ``token_file`` (``--token-file``), the file named by ``$GNNSERVE_TOKEN_FILE``, the
    value of ``$GNNSERVE_TOKEN``. A variable that is set counts even when blank (and is refused):
    ``GNNSERVE_TOKEN=`` in a deployment means a secret that did not arrive, not "no auth".
    """
    env = os.environ if environ is None else environ
    if token_file is not None:
        if not token_file.strip():
            raise SecurityConfigError("--token-file names no file")
        return read_token_file(token_file)
    if TOKEN_FILE_ENV in env and TOKEN_ENV in env:
        raise SecurityConfigError(f"both ${TOKEN_FILE_ENV} and ${TOKEN_ENV} are set: set one")
    if TOKEN_FILE_ENV in env:
        path = env[TOKEN_FILE_ENV]
        if not path.strip():
            raise SecurityConfigError(f"${TOKEN_FILE_ENV} is set but names no file")
        return read_token_file(path, f"${TOKEN_FILE_ENV}")
    if TOKEN_ENV in env:
        return _check_token_value(env[TOKEN_ENV], f"${TOKEN_ENV}")
    return None


def _check_pem(path: str, flag: str) -> None:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {flag} {path!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise SecurityConfigError(f"{flag} {path!r} is not a PEM file (no '-----BEGIN' line)")


def check_security_config(*, host: str, token: str | None = None, tls_cert: str | None = None,
                          tls_key: str | None = None, tls_client_ca: str | None = None,
                          insecure: bool = False) -> list[str]:
    """Raise :class:`SecurityConfigError` for a configuration the server must not start with.

    Returns the warnings to log (``insecure`` letting an unauthenticated server bind a
    non-loopback address). ``token`` is the token itself (``""`` is refused, ``None`` is no token).
    """
    if token is not None:
        _check_token_value(token, "the bearer token")
        if token != token.strip():  # gRPC metadata values lose surrounding whitespace: it could never match
            raise SecurityConfigError("the bearer token has leading or trailing whitespace")
    for value, flag in ((tls_cert, "--tls-cert"), (tls_key, "--tls-key"), (tls_client_ca, "--tls-client-ca")):
        if value is not None and not str(value).strip():
            raise SecurityConfigError(f"{flag} names no file")
    if tls_client_ca and not (tls_cert and tls_key):
        raise SecurityConfigError("--tls-client-ca needs --tls-cert and --tls-key: client certificates are "
                                  "checked only over TLS (without them the server would serve plaintext)")
    if bool(tls_cert) != bool(tls_key):
        raise SecurityConfigError("TLS needs both --tls-cert and --tls-key "
                                  f"(only {'--tls-cert' if tls_cert else '--tls-key'} was given)")
    for value, flag in ((tls_cert, "--tls-cert"), (tls_key, "--tls-key"), (tls_client_ca, "--tls-client-ca")):
        if value:
            _check_pem(str(value), flag)
    authenticated = token is not None or bool(tls_client_ca)
    warnings: list[str] = []
    if not authenticated and not is_loopback(host):
        if not insecure:
            raise SecurityConfigError(
                f"refusing to serve on {host!r} (not a loopback address) without authentication: give a bearer "
                "token (--token-file, $GNNSERVE_TOKEN_FILE or $GNNSERVE_TOKEN) or client certificates "
                "(--tls-cert, --tls-key, --tls-client-ca), or --insecure to serve unauthenticated anyway")
        warnings.append(f"--insecure: serving on {host!r} without authentication (no bearer token, no client "
                        "certificates): anyone who can reach this address can use the server")
    elif insecure:
        warnings.append("--insecure has no effect here: "
                        + ("authentication is configured" if authenticated else f"{host!r} is a loopback address"))
    return warnings
