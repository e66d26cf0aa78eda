"""kernels.malloc: glibc keeps freed batch memory for reuse (checked with mallinfo2, not with a clock)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent(
    """
    import ctypes, sys, threading
    import numpy as np
    from kernels.malloc import tune_malloc

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    ok = tune_malloc()
    assert tune_malloc() == ok  # idempotent
    out = {}

    def work():  # in a worker thread, like the server's batches
        a = np.ones(96 << 20, dtype=np.uint8)
        out["mapped_while_live"] = libc.mallinfo2().hblkhd
        del a
        out["free_in_heap"] = libc.mallinfo2().fordblks

    t = threading.Thread(target=work)
    t.start()
    t.join()
    print(ok, out["mapped_while_live"], out["free_in_heap"])
    """
)


def run_probe(env_extra: dict[str, str]) -> tuple[str, int, int]:
    env = {**os.environ, "PYTHONPATH": ROOT, **env_extra}
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    ok, mapped, free = res.stdout.split()
    return ok, int(mapped), int(free)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_batch_memory_stays_in_the_heap_for_reuse():
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("not glibc >= 2.33")
    ok, mapped, free = run_probe({"GNNSERVE_MALLOC": ""})
    assert ok == "True"
    assert mapped < (96 << 20)  # the 96 MiB block came from the heap, not from mmap
    assert free >= (96 << 20)  # and stays there, free for the next batch
    ok, mapped, free = run_probe({"GNNSERVE_MALLOC": "default"})
    assert ok == "False"
    assert mapped >= (96 << 20)  # glibc's default: a fresh mapping, unmapped on free
