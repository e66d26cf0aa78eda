"""Exit 0 when a gnnserve server reports SERVING on ``grpc.health.v1``, else 1 (container health checks).

    python -m serve.healthcheck [--address 127.0.0.1:8500] [--service NAME] [--timeout 3]
                                [--tls] [--ca FILE] [--cert FILE --key FILE] [--server-name NAME]

``--server`` is another name of ``--address`` (the ``gnnserve`` client commands call it so), and a HOST
alone means port 8500 as there (gRPC would pick 443). Options are
never abbreviated: argparse's prefix matching once read ``--server HOST:PORT`` as ``--server-name`` and
probed the default address.

``--ca``, ``--cert`` and ``--key`` imply ``--tls``; ``--cert``/``--key`` present a client certificate
to a server started with ``--tls-client-ca`` (mutual TLS). Exit 2 on a usage error (an unreadable
file, ``--cert`` without ``--key``).

Prints the status (exit 0 only for ``SERVING``), ``UNREACHABLE: CODE: why`` when no health answer came, or
``SERVICE_UNKNOWN: ...`` when the server answered but has no status for ``--service``.

Uses only grpc and the health stubs (no torch), so it starts fast enough for a Docker
``HEALTHCHECK`` every few seconds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["SERVICES", "check", "main"]

#: the services a gnnserve server reports a health status for ('' is the whole server); the names of
#: ``serve.server.GNN_SERVICE`` and ``TRITON_SERVICE``, written out here because importing them would
#: import the server (tests/test_cli_errors.py holds them equal)
SERVICES = ("", "gnnserve.v1.GnnService", "inference.GRPCInferenceService")


def address_of(value: str) -> str:
    """``--address`` as a gRPC target: a HOST alone gets port 8500 (``clients.cli.server_address``' rule for the
    plain case; that module imports NumPy, too slow for a probe run every few seconds); anything with a ``:``
    (``HOST:PORT``, ``[v6]:PORT``, ``unix:PATH``, ``dns:...``) is passed as it is."""
    text = value.strip()
    return text if ":" in text else f"{text}:8500"


def check(address: str, service: str = "", timeout: float = 3.0, *, tls: bool = False,
          ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
          server_name: str | None = None) -> str:
    """The serving status name (``SERVING``, ``NOT_SERVING``, ...) or ``UNREACHABLE: <reason>``.

    ``cert_file``/``key_file``: a client certificate and its key (PEM) for mutual TLS (imply ``tls``).
    """
    if bool(cert_file) != bool(key_file):
        raise ValueError("a client certificate needs both --cert and --key")
    if tls or ca_file or cert_file:
        roots = Path(ca_file).read_bytes() if ca_file else None
        chain = Path(cert_file).read_bytes() if cert_file else None
        key = Path(key_file).read_bytes() if key_file else None
        creds = grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else None
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # grpc.health.v1's answer for a service it has no status of
                known = ", ".join(repr(s) for s in SERVICES)
                return (f"SERVICE_UNKNOWN: the server at {address} is reachable but has no health status for "
                        f"service {service!r} (a gnnserve server has {known}; '' is the whole server)")
            return f"UNREACHABLE: {exc.code().name}: {exc.details() or 'no details'}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.healthcheck", description=__doc__.splitlines()[0],
                                 allow_abbrev=False)  # "--server" must never become "--server-name"
    ap.add_argument("--address", "--server", dest="address", default="127.0.0.1:8500",
                    help="HOST:PORT of the server, port 8500 when only HOST is given (default: %(default)s)")
    ap.add_argument("--service", default="", help="service name ('' = the whole server)")
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--tls", action="store_true", help="TLS (verify the server against --ca or the system roots)")
    ap.add_argument("--ca", default=None, help="CA certificate (PEM) to verify the server with; implies --tls")
    ap.add_argument("--cert", default=None, help="client certificate (PEM) for mutual TLS; with --key")
    ap.add_argument("--key", default=None, help="client private key (PEM) for mutual TLS; with --cert")
    ap.add_argument("--server-name", default=None, help="name to expect in the server's certificate")
    args = ap.parse_args(argv)
    try:
        status = check(address_of(args.address), args.service, args.timeout, tls=args.tls, ca_file=args.ca,
                       cert_file=args.cert, key_file=args.key, server_name=args.server_name)
    except (OSError, ValueError) as exc:
        print(f"python -m serve.healthcheck: {exc}", file=sys.stderr)
        return 2
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
