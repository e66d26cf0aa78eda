"""``gnnserve log``: look into a repository's graph update logs, and cut one back (an operator's repair).

A server writes every accepted update to its graph's log (``REPO/_live/<dataset fingerprint>.log``, or
``--update-log-dir``; :mod:`serve.update_log`) and replays it at start. An update that cannot be applied
again (a bug, a resource the machine no longer has) keeps that graph out of service at every restart:
the server logs which version failed. ``gnnserve log show`` lists the logs and their records (what
each update changed, or the updates themselves as JSON lines that ``gnnserve update`` takes, each record's
version in a ``#`` comment line);
``gnnserve log truncate --after V`` drops every record after version ``V``, so that the graph replays to
``V`` and serves again. The updates dropped were acknowledged to their clients: they are lost unless
sent again (``show --json`` first keeps them). Truncating needs every server of the log stopped, the one
writing it and those following it (their locks say so otherwise), and ``--yes``; without it the command
says what it would drop. A log damaged before its last record (a valid record after bad bytes: the disk,
or a hand edit; a crash mid-write only tears the last record, which a server cuts off itself) keeps its
graph out of service: ``show`` lists the records in front of the damage and where it is (exit status 1),
and ``truncate --after V`` with ``V`` at most the last of those cuts the damage off with everything after
it (the records behind it cannot be replayed without the one it destroyed); or restore the log from a copy.

A log in Redis (servers with the graph or the features in Redis: the log is in the Redis of their ``--graph
URL``, else of their ``--features URL``) is listed by ``show --redis-url URL`` the same way; it is not cut
back here (several servers may write it at once): repair it from a Redis backup.

    gnnserve log show --repo REPO                       # every graph's log: versions, records, size
    gnnserve log show --repo REPO --graph cd91052d48c0  # its records, one line each
    gnnserve log show --repo REPO --graph cd91 --json > kept.jsonl
    gnnserve log truncate --repo REPO --graph cd91 --after 56 --yes
    gnnserve log show --redis-url redis://host:6379/0 --graph cd91
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .update_log import FileUpdateLog, UpdateLogError, UpdateLogInUse


def _logs(args: argparse.Namespace) -> list[Path]:
    if not (args.log_dir or args.repo):
        raise SystemExit("gnnserve log: give --repo (its logs are in REPO/_live) or --log-dir")
    d = Path(args.log_dir) if args.log_dir else Path(args.repo) / "_live"
    if not d.is_dir():
        raise SystemExit(f"gnnserve log: no update logs: {d} is not a directory (a server writes them there once it "
                         "takes an update; --log-dir for a server run with --update-log-dir)")
    found = {p.stem: p for p in sorted(d.glob("*.log"))}
    return [found[name] for name in _picked(list(found), args.graph, str(d))]


def _picked(names: list[str], graph: str | None, where: str) -> list[str]:
    """The graph fingerprints among ``names`` that ``--graph`` (a prefix) picks: every one without it,
    exactly one with it (none, or several, is the user's to say more)."""
    if not graph:
        return names
    names = [n for n in names if n.startswith(graph)]
    if not names:
        raise SystemExit(f"gnnserve log: no update log of a graph {graph!r} in {where}")
    if len(names) > 1:
        shown = ", ".join(n[:16] for n in names)
        raise SystemExit(f"gnnserve log: --graph {graph!r} matches several logs ({shown}): give more of it")
    return names


def _summary(update: Any) -> str:
    parts = [f"{n} {what}" for n, what in ((len(update.features), "feature rows"), (len(update.new_nodes), "new nodes"),
                                          (len(update.remove_edges), "edges removed"),
                                          (len(update.add_edges), "edges added")) if n]
    rid = f" [request {update.request_id}]" if update.request_id else ""
    return f"{', '.join(parts) or 'nothing'}{rid}"


def _as_update_line(update: Any) -> dict[str, Any]:
    """One update as ``gnnserve update``'s file format takes it (clients/cli.py)."""
    out: dict[str, Any] = {"request_id": update.request_id} if update.request_id else {}
    if update.features:
        out["features"] = {str(r.node): [float(v) for v in r.features] for r in update.features}
    if update.new_nodes:
        out["new_nodes"] = [{"features": [float(v) for v in n.features], "neighbors": [int(v) for v in n.neighbors],
                             **({"edge_weights": [float(v) for v in n.edge_weights]} if len(n.edge_weights) else {})}
                            for n in update.new_nodes]
    for key in ("remove_edges", "add_edges"):
        edges = getattr(update, key)
        if edges:
            out[key] = [[int(e.src), int(e.dst)] + ([float(e.weight)] if e.HasField("weight") else []) for e in edges]
    return out


def _show(args: argparse.Namespace) -> int:
    damaged = False
    any_log = False
    for name, where, lg in _opened(args):
        any_log = True
        if isinstance(lg, Exception):  # not a log, or its header is damaged: say so and list the others
            damaged = True
            print(f"graph {name}: {lg}; restore the log from a copy or rebuild the graph from a snapshot",
                  file=sys.stderr)
            continue
        try:
            with lg:
                damaged = _show_one(name, where, lg, args) or damaged
        except UpdateLogError as exc:  # this log (Redis refusing it, a record changed on disk): the others go on
            damaged = True
            print(f"graph {name}: {exc}", file=sys.stderr)
    if not any_log:
        print("no update logs", file=sys.stderr)
    return 1 if damaged else 0


def _show_one(name: str, where: str, lg: Any, args: argparse.Namespace) -> bool:
    """One log's lines (its records with --graph or --json); whether it is damaged."""
    from clients._gen import gnnserve_pb2 as pb

    damaged = False
    head, base = lg.head(), lg.base
    if getattr(lg, "damage", None) is not None:
        damaged = True
        print(f"graph {name}: {_damage_text(lg.damage, head, _truncate_command(args, name, head))}",
              file=sys.stderr)
    snapshot = isinstance(lg, FileUpdateLog) and lg.path.with_suffix(".snapshot").exists()
    if not args.json:
        held = f"versions {base + 1}..{head}" if head > base else "no records"
        compacted = f"; 1..{base} compacted{' into its snapshot' if snapshot else ''}" if base else ""
        print(f"graph {name}: {held} in the log ({head - base} records, {lg.size_bytes():,} bytes){compacted}  "
              f"{where}")
    if not (args.graph or args.json):
        return damaged
    after = base
    while after < head:
        for version, payload in lg.read(after, limit=1024):
            after = version
            rec = pb.UpdateLogRecord.FromString(payload)
            if args.json:  # a '#' line is a comment to 'gnnserve update'
                more = (f" ({len(rec.updates)} updates committed together; sent again, each takes a "
                        "version of its own)") if len(rec.updates) > 1 else ""
                print(f"# graph {name} version {version}{more}")
                for u in rec.updates:
                    print(json.dumps(_as_update_line(u)))
            else:
                text = "; ".join(_summary(u) for u in rec.updates)
                print(f"  {version}: {len(payload):,} bytes, {len(rec.updates)} update(s): {text}")
    return damaged


def _opened(args: argparse.Namespace) -> Iterator[tuple[str, str, Any]]:
    """``(graph, where, log)`` for each log ``show`` looks at: file logs opened to follow and salvage, or
    with ``--redis-url`` the Redis logs of every graph there; ``log`` is the error where one cannot be
    opened (the listing goes on)."""
    if args.redis_url:
        yield from _redis_logs(args)
        return
    for path in _logs(args):
        try:
            yield path.stem[:12], str(path), FileUpdateLog(path, follow=True, salvage=True)
        except UpdateLogError as exc:
            yield path.stem[:12], str(path), exc


def _redis_logs(args: argparse.Namespace) -> Iterator[tuple[str, str, Any]]:
    """The Redis update logs (one per graph fingerprint, found by their head keys) of ``--redis-url``."""
    from .redisdata.connection import connect, parse_redis_url
    from .update_log import LIVE_PREFIX, RedisUpdateLog, UpdateLogUnavailable

    try:
        target = parse_redis_url(args.redis_url)
    except ValueError as exc:
        raise SystemExit(f"gnnserve log: --redis-url: {exc}") from None
    try:
        client = connect(target, socket_timeout=2.0, connect_timeout=1.0, retries=1)
        suffix = ":{log}:head"
        fps = sorted({(k.decode() if isinstance(k, bytes) else k)[len(LIVE_PREFIX) + 1: -len(suffix)]
                      for k in client.scan_iter(match=f"{LIVE_PREFIX}:*:{{log}}:head", count=1000)})
    except Exception as exc:  # a connection refused or timed out: redis-py's errors, without the URL
        raise UpdateLogUnavailable(f"Redis at {target.masked} cannot be read ({type(exc).__name__}: "
                                   f"{target.scrub(str(exc))}); is the --redis-url right and Redis up?") from None
    try:
        for fp in _picked(fps, args.graph, f"Redis at {target.masked}"):
            where = f"redis {target.masked} key {LIVE_PREFIX}:{fp}:{{log}}"
            try:
                yield fp[:12], where, RedisUpdateLog(args.redis_url, fp, client=client)
            except UpdateLogError as exc:  # this graph's log; the others are still listed
                yield fp[:12], where, exc
    finally:
        client.close()


def _word(text: str) -> str:
    """``text`` as one shell word: as it is when it needs no quoting, else in double quotes (the commands
    shown are themselves in single quotes)."""
    if text and shlex.quote(text) == text:
        return text
    return '"' + "".join("\\" + c if c in '"\\$`' else c for c in text) + '"'


def _location(args: argparse.Namespace) -> str:
    """The options that find the file logs ``args`` looked at, as a command line takes them again."""
    return f"--log-dir {_word(args.log_dir)}" if args.log_dir else f"--repo {_word(args.repo)}"


def _truncate_command(args: argparse.Namespace, graph: str, after: int) -> str:
    """The whole ``gnnserve log truncate`` command that cuts ``graph``'s file log after ``after``, with the
    location options ``args`` was given: it works when copied."""
    return f"gnnserve log truncate {_location(args)} --graph {_word(graph)} --after {after} --yes"


def _damage_text(d: Any, head: int, command: str) -> str:
    later = (f"versions {d.later_versions[0]}..{d.later_versions[-1]} follow" if len(d.later_versions) > 1
             else f"version {d.later_versions[0]} follows" if d.later_versions else "records follow")
    return (f"DAMAGED at byte offset {d.offset:,} ({d.problem}), after version {head}; {later} it from byte "
            f"offset {d.next_valid:,} and cannot be replayed without what it destroyed. The graph stays out of "
            f"service until '{command}' cuts the damage and everything after it off "
            f"({d.size - d.offset:,} bytes; those updates are lost unless sent again), or the log is restored from a "
            "copy")


def _truncate(args: argparse.Namespace) -> int:
    if args.redis_url:
        print("gnnserve log truncate: a Redis log is not cut back here: several servers may write it at once, and "
              "nothing here can tell that every one of them stopped. 'gnnserve log show --redis-url' lists it; "
              "repair it from a Redis backup (appendonly files or RDB snapshots)", file=sys.stderr)
        return 2
    (path,) = _logs(args) if args.graph else (None,)
    if path is None:
        raise SystemExit("gnnserve log truncate: --graph is required (the fingerprint prefix 'show' lists)")
    try:
        # a dry run reads (as a follower: it writes nothing, not even a torn tail's cut); --yes opens to write
        lg = FileUpdateLog(path, salvage=True, follow=not args.yes)
    except UpdateLogInUse:
        print(f"gnnserve log truncate: a server is running on {path} (it holds the log's lock): stop every server "
              "of this repository first", file=sys.stderr)
        return 1
    with lg:
        head, base = lg.head(), lg.base
        after = int(args.after)
        if after < 0:
            print("gnnserve log truncate: --after must be >= 0 (a graph version; 0 drops every record)",
                  file=sys.stderr)
            return 2
        if after < base:
            print(f"gnnserve log truncate: versions 1..{base} of graph {path.stem[:12]} are compacted into its "
                  f"snapshot ({path.with_suffix('.snapshot')}); the log holds {base + 1}..{head} only", file=sys.stderr)
            return 2
        damage = lg.damage
        if after >= head and damage is None:
            print(f"graph {path.stem[:12]}: the log ends at version {head}; nothing after {after} to drop")
            return 0
        if after > head:
            text = _damage_text(damage, head, _truncate_command(args, path.stem[:12], head))
            print(f"gnnserve log truncate: graph {path.stem[:12]}: {text}. --after can be at most {head}",
                  file=sys.stderr)
            return 2
        what = (f"{head - after} record(s), versions {after + 1}..{head}, of graph {path.stem[:12]}" if after < head
                else f"nothing in front of the damage of graph {path.stem[:12]}")
        if damage is not None:
            what += (f", and the damage at byte offset {damage.offset:,} with the {damage.size - damage.offset:,} "
                     f"bytes after it ({len(damage.later_versions)} valid record(s) among them)")
        if not args.yes:
            keep = f"gnnserve log show {_location(args)} --graph {_word(path.stem[:12])} --json > kept.jsonl"
            print(f"would drop {what}; the graph would then replay to version {after}. These updates were "
                  f"acknowledged to their clients: keep them first with '{keep}'. Add --yes to drop them.")
            return 0
        try:
            lg.truncate_after(after)
        except UpdateLogInUse as exc:
            print(f"gnnserve log truncate: {exc}", file=sys.stderr)
            return 1
        print(f"dropped {what}; the graph replays to version {after} at the next start")
    return 0


_EPILOG = """\
subcommands:
  show      list every graph's update log (versions, records, size) of a repository, or with --graph one
            log's records, one line each, or with --json its updates as JSON lines that 'gnnserve update'
            takes; --redis-url lists the logs kept in Redis. Exit status 1 when a log is damaged.
  truncate  drop every record of one file log (--graph) after version --after, so that the graph
            replays to that version and serves again (a logged update that cannot be applied again, or
            damage in the log). Every server of the log must be stopped; without --yes it only says
            what it would drop. The dropped updates are lost unless sent again: 'show --json' first.
            A log in Redis is not cut back here: restore it from a Redis backup.

examples:
  gnnserve log show --repo REPO
  gnnserve log show --repo REPO --graph cd91052d48c0
  gnnserve log show --repo REPO --graph cd91 --json > kept.jsonl
  gnnserve log truncate --repo REPO --graph cd91 --after 56            # a dry run
  gnnserve log truncate --repo REPO --graph cd91 --after 56 --yes
  gnnserve log show --redis-url redis://host:6379/0 --graph cd91

'gnnserve log SUBCOMMAND --help' lists a subcommand's options."""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gnnserve log", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Look into the graph update logs a server keeps (and replays at start), "
                                             "and cut one\nback: an operator's repair when a logged update keeps a "
                                             "graph out of service.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (("show", "list the logs, or one graph's records (--graph), or its updates as JSON lines"),
                       ("truncate", "drop every record after --after (every server of the repository stopped)")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--repo", default=None,
                       help="the model repository the servers serve (logs in REPO/_live); this or --log-dir"
                            + (" or --redis-url" if name == "show" else ""))
        p.add_argument("--log-dir", default=None,
                       help="the servers' --update-log-dir (default: REPO/_live); used instead of --repo")
        p.add_argument("--graph", default=None,
                       help="a graph's dataset fingerprint, or its first characters (as 'show' lists them)"
                            + ("; default: every graph's log, one summary line each" if name == "show"
                               else "; required"))
        if name == "show":
            p.add_argument("--redis-url", default=None,
                           help="the Redis of the servers' --graph URL (else of their Redis --features URL): their "
                                "graphs' update logs are there; read them instead of file logs")
            p.add_argument("--json", action="store_true",
                           help="the updates as JSON lines, each record's version in a '#' comment line before "
                                "it (the format 'gnnserve update' takes)")
        else:
            p.add_argument("--redis-url", default=None,
                           help="refused: a log in Redis is not cut back here (several servers may write it at "
                                "once); the command says so and exits 2. Repair it from a Redis backup")
            p.add_argument("--after", type=int, required=True,
                           help="keep the records up to this graph version, drop those after it (0: drop every "
                                "record)")
            p.add_argument("--yes", action="store_true",
                           help="drop them (without it: a dry run that says what would be dropped)")
    args = ap.parse_args(argv)
    try:
        return _show(args) if args.cmd == "show" else _truncate(args)
    except UpdateLogError as exc:
        print(f"gnnserve log: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head, say
        from .cli import stdout_closed

        return stdout_closed()


if __name__ == "__main__":
    raise SystemExit(main())
