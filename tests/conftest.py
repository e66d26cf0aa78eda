"""Shared fixtures. Real datasets are found through GNNSERVE_DATA (default: ../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("GNNSERVE_DATA", REPO.parent / "shared" / "data"))


def dataset_path(name: str) -> Path:
    """Path of a real dataset; skips the test where the shared data is absent."""
    p = DATA_DIR / f"{name}.npz"
    if not p.exists():
        pytest.skip(f"real dataset {p} not present (set GNNSERVE_DATA)")
    return p


@pytest.fixture(scope="session")
def small_dataset():
    from kernels.datasets import synthetic_sbm

    return synthetic_sbm(600, num_classes=4, avg_degree=10, num_features=16, seed=7)


@pytest.fixture(scope="session")
def tiny_dataset():
    """The synthetic graph every server test serves (deterministic)."""
    from .serving import tiny_dataset as make

    return make()


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory, tiny_dataset):
    """A model repository with a shaDow-SAGE model ("shadow") and a plain GCN ("gcn"), trained once."""
    from .serving import make_repo

    return make_repo(tmp_path_factory.mktemp("repo"), tiny_dataset, {"shadow": "shadow-sage", "gcn": "gcn"})


@pytest.fixture(scope="session")
def served(tiny_repo):
    """A real gnnserve server on loopback over ``tiny_repo`` (shared by the session's tests)."""
    from .serving import ServerThread

    srv = ServerThread(tiny_repo).start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """Each test leaves the root logger as it found it: a command run in-process (`gnnserve serve`, `demo`) sets
    its handler and level, which would otherwise print later tests' INFO lines into their captured stderr."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
