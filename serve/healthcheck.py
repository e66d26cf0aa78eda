"""Exit 0 when a gnnserve server reports SERVING on ``grpc.health.v1``, else 1 (container health checks).

    python -m serve.healthcheck [--address 127.0.0.1:8500] [--service NAME] [--timeout 3] [--tls --ca FILE]

Uses only grpc and the health stubs (no torch), so it starts fast enough for a Docker
``HEALTHCHECK`` every few seconds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["check", "main"]


def check(address: str, service: str = "", timeout: float = 3.0, *, tls: bool = False,
          ca_file: str | None = None) -> str:
    """The serving status name (``SERVING``, ``NOT_SERVING``, ...) or ``UNREACHABLE: <reason>``."""
    if tls:
        roots = open(ca_file, "rb").read() if ca_file else None
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=roots))
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
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--ca", default=None, help="CA certificate to verify the server with")
    args = ap.parse_args(argv)
    status = check(args.address, args.service, args.timeout, tls=args.tls, ca_file=args.ca)
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
