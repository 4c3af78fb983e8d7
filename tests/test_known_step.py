"""The hand-built known-step trace (tests/knownstep.py): every figure equal to the one worked out
by hand, and the analysis' self checks on it and on every committed fixture."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from stepscope.analysis.diagnosis import diagnose
from stepscope.api import open_trace
from stepscope.render.sections import step_sections
from tests.knownstep import KNOWN, build

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    path = build(tmp_path_factory.mktemp("known") / "known.sqlite")
    inv = open_trace(path).inventory
    return inv, diagnose(inv)


def test_three_steps_of_four_kernels(known):
    inv, _ = known
    assert inv.steps["step"].to_list() == [0, 1, 2]
    assert inv.steps["delimiter"].to_list() == ["nvtx"] * 3
    assert inv.steps["phase"].to_list() == ["decode"] * 3


@pytest.mark.parametrize("step", [0, 1, 2])
def test_every_figure_by_hand(known, step):
    inv, d = known
    want = KNOWN[step]
    s = inv.steps.filter(pl.col("step") == step).row(0, named=True)
    for k in ("n_kernels", "kernel_time_sum_ns", "gpu_span_ns", "idle_ns", "gpu_busy_ns", "step_time_ns",
              "n_launch_calls", "launch_call_ns"):
        assert s[k] == want[k], k
    sec = step_sections(d, step)
    kinds = sec["gaps"]
    assert {k: (v["count"], v["time_ns"]) for k, v in kinds.items() if k in want["gaps"]} == want["gaps"]
    f = sec["floors"]
    assert (f["t_launch_ns"], f["cpu_floor_ns"], f["device_floor_ns"], f["verdict"]) == (
        want["t_launch_ns"], want["cpu_floor_ns"], want["gpu_busy_ns"], want["verdict"])
    if "host_wait_ns" in want:
        assert f["host_wait_ns"] == want["host_wait_ns"]
    c = inv.classes.filter(pl.col("step") == step)
    assert {r["class"]: (r["count"], r["time_ns"]) for r in c.iter_rows(named=True)} == want["classes"]


def test_untraced_estimate_by_hand(known):
    """Step 2: the launch intervals of 5,000 ns lose 20 µs each, down to 2,000 (the first one, 100
    ns after the range's start, stays: it is shorter); each 100 ns kernel follows its call by its
    100 ns latency: calls at 40,100 / 42,100 / 44,100 / 46,100, the last kernel ends at 46,300, the
    host's tail after it (the range ends at 60,000, 4,700 after the last kernel) is kept:
    46,300 + 4,700 - 40,000 = 11,000. Step 0: intervals under 2 µs stay, so the estimate is the
    traced step (9,000). Step 1: only the 2,600 ns interval shrinks (to 2,000): the third kernel
    is ready at 22,600, runs to 23,600, the fourth to 23,700, plus the 5,700 tail: 9,400."""
    _, d = known
    u = d.untraced.sort("step")
    assert u["untraced_estimated_ns"].to_list() == [9_000, 9_400, 11_000]
    assert u["untraced_source"].str.starts_with("estimated").all()


def test_self_check_on_the_known_trace(known):
    _, d = known
    d.self_check()


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("**/*.sqlite")), ids=lambda p: p.name)
def test_self_check_on_every_fixture(path):
    inv = open_trace(path).inventory
    diagnose(inv).self_check()
