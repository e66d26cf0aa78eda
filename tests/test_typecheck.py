"""The client SDK ships ``py.typed``: its annotations must hold, checked by mypy (config in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO


def test_clients_type_check():
    pytest.importorskip("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "Success" in res.stdout
