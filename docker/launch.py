#!/usr/bin/env python3
"""``gnnserve`` with the Redis password from a secret file: the images' ENTRYPOINT (``gnnserve-launch``).

    gnnserve-launch <gnnserve command and options...>

With ``$REDIS_PASSWORD_FILE`` set, every Redis URL argument without credentials
(``redis://redis:6379/0``, ``--graph=rediss://...``, ``redis+cluster://a:6379,b:6379``,
``unix:///run/redis.sock``) gets the file's password, inside this process, before ``gnnserve``'s own
``main`` parses it: the password is in no process's arguments (``ps``, ``/proc/PID/cmdline``) and in
no compose file. A missing, unreadable or blank file exits 2. Without ``$REDIS_PASSWORD_FILE`` this
is plain ``gnnserve``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from urllib.parse import quote

SCHEMES = ("redis://", "rediss://", "redis+cluster://", "rediss+cluster://", "unix://")


def with_password(arg: str, password: str) -> str:
    """``arg`` with ``:password@`` added when it is a Redis URL (or ``--opt=URL``) without credentials."""
    prefix = ""
    if arg.startswith("--") and "=" in arg:
        prefix, _, arg = arg.partition("=")
        prefix += "="
    for scheme in SCHEMES:
        if arg.lower().startswith(scheme):
            rest = arg[len(scheme):]
            if "@" in rest.split("?", 1)[0]:  # credentials given: leave them
                break
            return f"{prefix}{arg[:len(scheme)]}:{quote(password, safe='')}@{rest}"
    return prefix + arg


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = os.environ.get("REDIS_PASSWORD_FILE")
    if path is not None:
        try:
            password = open(path, encoding="utf-8").read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"gnnserve-launch: cannot read $REDIS_PASSWORD_FILE {path!r}: {reason}", file=sys.stderr)
            return 2
        if not password:
            print(f"gnnserve-launch: $REDIS_PASSWORD_FILE {path!r} is empty or blank", file=sys.stderr)
            return 2
        args = [with_password(a, password) for a in args]
    from serve.cli import main as gnnserve

    return gnnserve(args)


if __name__ == "__main__":
    sys.exit(main())
