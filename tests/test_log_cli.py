"""``gnnserve log`` (serve/log_cli.py) and a logged update that cannot be applied again: the server names
the version and the repair; ``show`` lists the records and gives them back in ``gnnserve update``'s
format; ``truncate`` refuses while a server holds the log, says what it would drop without ``--yes``, and
with it the graph replays to the version kept and serves again. Real servers, real trained models, the
real file log."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clients import GnnClient
from clients._gen import gnnserve_pb2 as pb
from clients.cli import read_updates
from clients.errors import FailedPreconditionError
from serve.log_cli import main as log_main
from serve.update_log import FileUpdateLog, UpdateLogError

from .serving import ServerThread

pytest_plugins = ("tests.redis_server",)


@pytest.fixture()
def repo(tiny_repo: Path, tmp_path: Path) -> Path:
    d = tmp_path / "repo"
    shutil.copytree(tiny_repo, d, ignore=shutil.ignore_patterns("_live", "_ppr"))
    return d


def test_a_poisoned_record_is_named_listed_and_dropped(repo: Path, capsys, caplog) -> None:
    with ServerThread(repo, {"poll_s": 0}) as srv, GnnClient(srv.address) as c:
        assert c.update_graph("gcn", add_edges=[(1, 2)], request_id="first").graph_version == 1
        assert c.update_graph("gcn", features={5: [0.5] * srv.server.registry.get("gcn").model.in_dim},
                              remove_edges=[(1, 2)]).graph_version == 2
        want = c.predict("gcn", [1, 5], sampling_width=0)
    (path,) = (repo / "_live").glob("*.log")
    label = path.stem[:12]
    bad = pb.UpdateLogRecord(updates=[pb.UpdateGraphRequest(add_edges=[pb.Edge(src=0, dst=10**9)])])
    with FileUpdateLog(path) as lg:  # accepted once, say, by code that no longer accepts it
        assert lg.append(bad.SerializeToString()) == 3

    with caplog.at_level("ERROR"), ServerThread(repo, {"poll_s": 0}) as srv:
        # no model on that graph loaded: out of service, with the cause (a model on disk is not "not found")
        with GnnClient(srv.address, max_retries=0) as c, \
                pytest.raises(FailedPreconditionError, match=r"out of service.*logged update 3 cannot be applied again"):
            c.predict("gcn", [1])
        # a server holds the log: truncating is refused
        assert log_main(["truncate", "--repo", str(repo), "--graph", label, "--after", "2", "--yes"]) == 1
        assert "stop every server" in capsys.readouterr().err
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"graph {label}: logged update 3 cannot be applied again (GraphEditError" in text, text
    assert f"gnnserve log truncate --log-dir {path.parent} --graph {label} --after 2 --yes" in text, text

    assert log_main(["show", "--repo", str(repo)]) == 0
    assert f"graph {label}: versions 1..3 in the log (3 records" in capsys.readouterr().out
    assert log_main(["show", "--repo", str(repo), "--graph", label[:4]]) == 0
    out = capsys.readouterr().out
    assert "  1: " in out and "1 edges added [request first]" in out
    assert "  2: " in out and "1 feature rows, 1 edges removed" in out and "  3: " in out
    assert log_main(["show", "--repo", str(repo), "--graph", label, "--json"]) == 0
    lines = capsys.readouterr().out
    updates = read_updates(lines, "shown")  # what 'gnnserve update' would send again
    assert [u.get("add_edges") for u in updates] == [[[1, 2]], None, [[0, 10**9]]]
    assert updates[0]["request_id"] == "first" and set(updates[1]["features"]) == {"5"}
    assert updates[1]["remove_edges"] == [[1, 2]]
    assert "# graph " + label + " version 3" in lines

    assert log_main(["truncate", "--repo", str(repo), "--graph", label, "--after", "2"]) == 0  # a dry run
    assert "would drop 1 record(s), versions 3..3" in capsys.readouterr().out
    with FileUpdateLog(path, follow=True) as lg:
        assert lg.head() == 3
    assert log_main(["truncate", "--repo", str(repo), "--graph", label, "--after", "2", "--yes"]) == 0
    assert "dropped 1 record(s), versions 3..3" in capsys.readouterr().out
    with ServerThread(repo, {"poll_s": 0}) as srv, GnnClient(srv.address) as c:
        got = c.predict("gcn", [1, 5], sampling_width=0)
        assert got.graph_version == 2 and list(got.labels) == list(want.labels)


def test_truncate_after_keeps_whole_records_and_refuses_compacted_ones(tmp_path: Path) -> None:
    path = tmp_path / "g.log"
    with FileUpdateLog(path) as lg:
        for i in range(5):
            lg.append(bytes([i]) * (10 + i))
        assert lg.truncate_after(5) == 0 and lg.truncate_after(2) == 3 and lg.head() == 2
        assert lg.append(b"again") == 3  # appends go on after the cut
        lg.truncate_before(2)  # compaction: versions 1..2 in a snapshot
        with pytest.raises(UpdateLogError, match="compacted into the snapshot"):
            lg.truncate_after(1)
    with FileUpdateLog(path) as lg:  # reopened: the cut is on disk, nothing torn
        assert [v for v, _ in lg.read(2)] == [3] and lg.read(2)[0][1] == b"again"
    with FileUpdateLog(path, follow=True) as lg, pytest.raises(UpdateLogError, match="follow"):
        lg.truncate_after(2)


def test_truncate_is_refused_while_a_server_follows_the_log(tmp_path: Path, capsys) -> None:
    """A follower (a --read-only server, a --processes child) holds no writer's lock, but a shared one on
    ``<log>.readers``: truncating under it would cut records it applied, so it is refused; closed, the
    truncate goes ahead. A negative --after and a file that is not a log get one-line errors."""
    live = tmp_path / "_live"
    path = live / "abcdef123456.log"
    with FileUpdateLog(path) as lg:
        for i in range(4):
            lg.append(bytes([i]) * 8)
    follower = FileUpdateLog(path, follow=True)
    assert follower.head() == 4
    args = ["truncate", "--log-dir", str(live), "--graph", "abc", "--after", "2", "--yes"]
    assert log_main(args) == 1
    assert "followed by a running server" in capsys.readouterr().err
    with FileUpdateLog(path) as lg, pytest.raises(UpdateLogError, match="followed by a running server"):
        lg.truncate_after(2)
    follower.close()
    assert log_main(args) == 0 and "dropped 2 record(s), versions 3..4" in capsys.readouterr().out
    assert log_main(["truncate", "--log-dir", str(live), "--graph", "abc", "--after", "-1", "--yes"]) == 2
    assert "--after must be >= 0" in capsys.readouterr().err
    (live / "zzz.log").write_bytes(b"garbage\n")  # shorter than a header, and not the start of one
    assert log_main(["show", "--log-dir", str(live), "--graph", "zzz"]) == 1
    assert "is not an update log" in capsys.readouterr().err


def test_a_log_damaged_in_the_middle_is_listed_up_to_the_damage_and_cut_there(tmp_path: Path, capsys) -> None:
    """Bad bytes in front of a valid record (the disk, a hand edit): a server refuses the log (the graph stays
    out of service); ``show`` lists the records in front of the damage, says where it is and what follows
    (exit 1); ``truncate`` cuts it off with everything after it, at most at the last intact version, and the
    log opens and takes appends again."""
    live = tmp_path / "_live"
    path = live / "0123456789ab.log"
    with FileUpdateLog(path) as lg:
        for i in range(6):
            rec = pb.UpdateLogRecord(updates=[pb.UpdateGraphRequest(model="gcn", request_id=f"update-{i:04d}" * 3)])
            lg.append(rec.SerializeToString())
        offsets = list(lg._offsets)
    data = bytearray(path.read_bytes())
    data[offsets[3] + 30] ^= 0xFF  # record 4's payload: its CRC fails, records 5 and 6 stay valid
    path.write_bytes(bytes(data))
    with pytest.raises(UpdateLogError, match=f"damaged at byte offset {offsets[3]} .*'gnnserve log show'"):
        FileUpdateLog(path)
    with FileUpdateLog(path, salvage=True) as lg:  # nothing but truncate_after writes it
        assert lg.head() == 3 and lg.damage is not None and lg.damage.later_versions == (5, 6)
        with pytest.raises(UpdateLogError, match="only truncate_after"):
            lg.append(b"more")
    assert path.read_bytes() == bytes(data)  # opened to salvage: unchanged

    assert log_main(["show", "--log-dir", str(live), "--graph", "0123"]) == 1
    out, err = capsys.readouterr()
    assert [line.split(":")[0].strip() for line in out.splitlines()[1:]] == ["1", "2", "3"]
    assert f"DAMAGED at byte offset {offsets[3]:,} (CRC mismatch), after version 3; versions 5..6 follow" in err
    assert f"'gnnserve log truncate --log-dir {live} --graph 0123456789ab --after 3 --yes'" in err
    assert log_main(["truncate", "--log-dir", str(live), "--graph", "0123", "--after", "4", "--yes"]) == 2
    assert "--after can be at most 3" in capsys.readouterr().err
    assert log_main(["truncate", "--log-dir", str(live), "--graph", "0123", "--after", "3"]) == 0  # a dry run
    assert "would drop nothing in front of the damage" in capsys.readouterr().out
    assert path.read_bytes() == bytes(data)
    assert log_main(["truncate", "--log-dir", str(live), "--graph", "0123", "--after", "2", "--yes"]) == 0
    assert "dropped 1 record(s), versions 3..3" in capsys.readouterr().out
    assert path.stat().st_size == offsets[2]
    with FileUpdateLog(path) as lg:  # whole again: a server opens it and goes on
        assert lg.head() == 2 and lg.damage is None and lg.append(rec.SerializeToString()) == 3
    assert log_main(["show", "--log-dir", str(live), "--graph", "0123"]) == 0


def _records(n: int) -> list[bytes]:
    return [pb.UpdateLogRecord(updates=[pb.UpdateGraphRequest(model="gcn", request_id=f"r{i:03d}" * 4)])
            .SerializeToString() for i in range(n)]


def test_damaged_logs_among_others_missing_records_and_dry_runs(tmp_path: Path, capsys) -> None:
    """What a QA pass found: ``show`` without --graph reports a damaged log too (exit 1) and goes on past a
    log whose header is damaged; a record missing in the middle (versions not dense) is salvaged like bad
    bytes; a dry run writes nothing (not even a torn tail's cut); a follower that failed to open a damaged
    log leaves no lock behind to block the repair."""
    live = tmp_path / "_live"
    paths = {name: live / f"{name}.log" for name in ("aaaa00000000", "bbbb00000000", "cccc00000000", "dddd00000000")}
    offsets = {}
    for name, path in paths.items():
        with FileUpdateLog(path) as lg:
            for payload in _records(6):
                lg.append(payload)
            offsets[name] = list(lg._offsets)
    data = bytearray(paths["bbbb00000000"].read_bytes())
    data[offsets["bbbb00000000"][3] + 30] ^= 0xFF
    paths["bbbb00000000"].write_bytes(bytes(data))
    data = bytearray(paths["cccc00000000"].read_bytes())
    data[12] ^= 0xFF  # the header's base
    paths["cccc00000000"].write_bytes(bytes(data))
    o = offsets["dddd00000000"]
    data = paths["dddd00000000"].read_bytes()
    paths["dddd00000000"].write_bytes(data[: o[3]] + data[o[4]:])  # record 4 gone: 5 follows 3

    assert log_main(["show", "--log-dir", str(live)]) == 1
    out, err = capsys.readouterr()
    assert "graph aaaa00000000: versions 1..6" in out and "graph dddd00000000: versions 1..3" in out
    assert "graph bbbb00000000: DAMAGED at byte offset" in err and "its header (byte offset 0) fails its CRC" in err
    assert "graph dddd00000000: DAMAGED" in err and "(version 5 where 4 belongs)" in err
    with pytest.raises(UpdateLogError, match=r"expected 4 .*'gnnserve log show'"):
        FileUpdateLog(paths["dddd00000000"])
    for _ in range(3):  # a follower (a --read-only server) failing on it: nothing left held
        with pytest.raises(UpdateLogError):
            FileUpdateLog(paths["dddd00000000"], follow=True)
    assert log_main(["truncate", "--log-dir", str(live), "--graph", "dddd", "--after", "3", "--yes"]) == 0
    with FileUpdateLog(paths["dddd00000000"]) as lg:
        assert lg.head() == 3 and lg.append(_records(1)[0]) == 4

    torn = paths["aaaa00000000"]
    whole = torn.read_bytes()
    torn.write_bytes(whole[:-7])  # a crash in the middle of the last write
    assert log_main(["truncate", "--log-dir", str(live), "--graph", "aaaa", "--after", "2"]) == 0
    assert "would drop 3 record(s), versions 3..5" in capsys.readouterr().out
    assert torn.read_bytes() == whole[:-7]  # the dry run did not cut the torn tail


def test_show_lists_redis_logs_and_truncate_refuses_them(redis_server, capsys) -> None:
    """``show --redis-url``: each graph's Redis log (found by its keys), its records with --graph, the updates
    as JSON lines with --json; ``truncate --redis-url`` is refused with what to do; an unreachable Redis is
    one line, without the URL's password."""
    import uuid

    from serve.update_log import RedisUpdateLog

    fps = ["a" + uuid.uuid4().hex[:15], "b" + uuid.uuid4().hex[:15]]
    for n, fp in enumerate(fps):
        with RedisUpdateLog(redis_server.url, fp) as lg:
            for payload in _records(2 + n):
                lg.append(payload)
    assert log_main(["show", "--redis-url", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert f"graph {fps[0][:12]}: versions 1..2 in the log (2 records" in out
    assert f"graph {fps[1][:12]}: versions 1..3 in the log (3 records" in out
    assert log_main(["show", "--redis-url", redis_server.url, "--graph", fps[1][:10]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["1", "2", "3"]
    assert log_main(["show", "--redis-url", redis_server.url, "--graph", fps[1], "--json"]) == 0
    kept = [json.loads(line) for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert [u["request_id"] for u in kept] == [f"r{i:03d}" * 4 for i in range(3)]
    assert log_main(["truncate", "--redis-url", redis_server.url, "--graph", fps[1], "--after", "1", "--yes"]) == 2
    assert "a Redis log is not cut back here" in capsys.readouterr().err
    with RedisUpdateLog(redis_server.url, fps[1]) as lg:
        assert lg.head() == 3  # untouched
    assert log_main(["show", "--redis-url", "redis://:s3cret@127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err
    assert "cannot be read" in err and "s3cret" not in err


def test_bytes_removed_from_the_middle_refuse_the_log_and_keep_the_later_records(tmp_path: Path, capsys) -> None:
    """A stretch cut out of the middle (a bad copy, a hand edit): the records after it have versions far
    above the last intact one. The log is refused as damaged (never cut as a torn tail: those records were
    acknowledged), and ``show`` names what follows."""
    path = tmp_path / "_live" / "feedbeef0000.log"
    with FileUpdateLog(path) as lg:
        for payload in _records(300):
            lg.append(payload)
        offsets = list(lg._offsets)
    data = path.read_bytes()
    path.write_bytes(data[: offsets[9] + 25] + data[offsets[289] + 25:])  # from inside record 10 into record 290
    size = path.stat().st_size
    with pytest.raises(UpdateLogError, match="damaged at byte offset"):
        FileUpdateLog(path)
    assert path.stat().st_size == size  # nothing cut
    with FileUpdateLog(path, salvage=True, follow=True) as lg:
        assert lg.head() == 9 and lg.damage is not None and lg.damage.later_versions == tuple(range(291, 301))
    assert log_main(["show", "--log-dir", str(path.parent)]) == 1
    assert "after version 9; versions 291..300 follow it" in capsys.readouterr().err


def test_graph_prefix_picks_one_log(tmp_path: Path) -> None:
    """--graph is a prefix of one graph's fingerprint: none or several matching is a one-line error."""
    live = tmp_path / "_live"
    for name in ("abc100000000", "abc200000000"):
        with FileUpdateLog(live / f"{name}.log") as lg:
            lg.append(_records(1)[0])
    with pytest.raises(SystemExit, match="matches several logs \\(abc100000000, abc200000000\\)"):
        log_main(["show", "--log-dir", str(live), "--graph", "abc"])
    with pytest.raises(SystemExit, match="no update log of a graph 'zzz'"):
        log_main(["show", "--log-dir", str(live), "--graph", "zzz"])
    assert log_main(["show", "--log-dir", str(live), "--graph", "abc2"]) == 0
