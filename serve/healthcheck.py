"""Exit 0 when a gnnserve server reports SERVING on ``grpc.health.v1``, else 1 (container health checks).

    python -m serve.healthcheck [--address 127.0.0.1:8500] [--service NAME] [--timeout 3]
                                [--tls] [--ca FILE] [--cert FILE --key FILE] [--server-name NAME]

``--ca``, ``--cert`` and ``--key`` imply ``--tls``; ``--cert``/``--key`` present a client certificate
to a server started with ``--tls-client-ca`` (mutual TLS). Exit 2 on a usage error (an unreadable
file, ``--cert`` without ``--key``).

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

__all__ = ["check", "main"]


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
            return f"UNREACHABLE: {exc.code().name}: {exc.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.healthcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="127.0.0.1:8500")
    ap.add_argument("--service", default="", help="service name ('' = the whole server)")
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--tls", action="store_true", help="TLS (verify the server against --ca or the system roots)")
    ap.add_argument("--ca", default=None, help="CA certificate (PEM) to verify the server with; implies --tls")
    ap.add_argument("--cert", default=None, help="client certificate (PEM) for mutual TLS; with --key")
    ap.add_argument("--key", default=None, help="client private key (PEM) for mutual TLS; with --cert")
    ap.add_argument("--server-name", default=None, help="name to expect in the server's certificate")
    args = ap.parse_args(argv)
    try:
        status = check(args.address, args.service, args.timeout, tls=args.tls, ca_file=args.ca,
                       cert_file=args.cert, key_file=args.key, server_name=args.server_name)
    except (OSError, ValueError) as exc:
        print(f"python -m serve.healthcheck: {exc}", file=sys.stderr)
        return 2
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
