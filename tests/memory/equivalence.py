"""Loss-curve comparison shared by the memory tests: the same command with and without a feature."""

from __future__ import annotations

ITERS = 10
REL_TOL = 1e-5


def assert_same_losses(base: list[dict], other: list[dict], iters: int = ITERS, rel_tol: float = REL_TOL) -> float:
    """First iteration exactly equal, every iteration within ``rel_tol`` (relative); returns the largest
    relative difference (printed by the tests, shown with ``pytest -s``)."""
    assert [r["iteration"] for r in base] == [r["iteration"] for r in other] == list(range(1, iters + 1))
    assert base[0]["loss"] == other[0]["loss"], (base[0]["loss"], other[0]["loss"])
    worst = 0.0
    for b, o in zip(base, other):
        rel = abs(b["loss"] - o["loss"]) / abs(b["loss"])
        assert rel <= rel_tol, f"iteration {b['iteration']}: {b['loss']} vs {o['loss']} (rel {rel:.2e})"
        worst = max(worst, rel)
    assert base[-1]["loss"] < base[0]["loss"]  # the runs trained
    return worst
