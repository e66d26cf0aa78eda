"""The client commands of ``gnnserve`` (predict, models, update) import neither the kernels package nor numba nor
PyTorch: a new user's report measured 3.1-3.3 s and 308 MB per `gnnserve predict` importing them for nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv", [["models", "--server", "127.0.0.1:1", "--timeout", "0.5"],
                                  ["predict", "--model", "m", "--nodes", "1", "--server", "127.0.0.1:1",
                                   "--timeout", "0.5"],
                                  ["update", "--model", "m", "--server", "127.0.0.1:1", "--timeout", "0.5",
                                   "/nonexistent-updates.jsonl"]])
def test_client_commands_import_no_kernels(argv):
    code = ("import sys; from serve.cli import main; rc = main(sys.argv[1:]); "
            "print('loaded', sorted(m for m in ('torch', 'numba', 'kernels') if m in sys.modules), 'rc', rc)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=120)
    assert "loaded [] rc" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert not proc.stdout.rstrip().endswith("rc 0")  # no server there: the command failed, and said so
    assert proc.stderr.strip()


def test_other_commands_still_tune_malloc_first():
    """The server-side commands keep their malloc settings (kernels.malloc, before any thread)."""
    code = ("import sys, kernels.malloc as m; called = []; m.tune_malloc = lambda: called.append(1)\n"
            "from serve.cli import main\n"
            "try:\n    main(['log', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('tuned', called)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert "tuned [1]" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
