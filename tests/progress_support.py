"""A stand-in for ``tqdm.auto.tqdm`` that records every bar made (what the progress tests check): install it
with ``monkeypatch.setattr(tqdm.auto, "tqdm", bars)``; the code under test imports tqdm at call time."""

from __future__ import annotations

from typing import Any


class RecordingBars:
    """Called as ``tqdm(iterable=None, **kwargs)``; each bar made is a dict in :attr:`made` with its ``desc``,
    ``total``, ``unit``, ``disable`` and the ``updates`` it was given (an iterable's steps are not counted)."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []

    def __call__(self, iterable: Any = None, **kw: Any) -> Any:
        rec: dict[str, Any] = {"desc": kw.get("desc"), "total": kw.get("total"), "unit": kw.get("unit"),
                               "disable": kw.get("disable"), "updates": [], "postfix": []}
        if iterable is not None and rec["total"] is None and hasattr(iterable, "__len__"):
            rec["total"] = len(iterable)
        self.made.append(rec)

        class Bar:
            def __enter__(self) -> Bar:
                return self

            def __exit__(self, *exc: Any) -> bool:
                return False

            def __iter__(self) -> Any:
                return iter(iterable)

            def update(self, k: int = 1) -> None:
                rec["updates"].append(k)

            def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
                rec["postfix"].append({**(ordered_dict or {}), **kwargs})

            def close(self) -> None:
                pass

        return Bar()

    def named(self, desc: str) -> dict[str, Any]:
        """The one bar made with this description."""
        found = [b for b in self.made if b["desc"] == desc]
        assert len(found) == 1, (desc, [b["desc"] for b in self.made])
        return found[0]
