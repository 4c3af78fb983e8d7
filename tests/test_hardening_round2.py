"""Crashes and unbounded costs found past the fault campaign (issue 30), each reproduced on a
damaged copy of a real fixture first."""

from __future__ import annotations

import shutil
import sqlite3
import time

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, need, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
CELLS = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
K = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.sqlite"
    shutil.copy(need(EAGER), p)
    return p


def one_line_2(r, *needles):
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in r.output, r.output


def test_bisect_over_a_start_of_text(trace):
    from stepscope.launch_config import rows_near

    with sqlite3.connect(trace) as c:
        n = c.execute(f"SELECT COUNT(*) FROM {K}").fetchone()[0]
        c.execute(f"UPDATE {K} SET start = 'x' || start WHERE rowid IN (SELECT rowid FROM {K} ORDER BY rowid "
                  f"LIMIT 50 OFFSET {n // 2 - 25})")
    with ro(trace) as c:
        lo, hi = c.execute(f"SELECT MIN(start), MAX(start) FROM {K} WHERE typeof(start) = 'integer'").fetchone()
        first, last = c.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {K}").fetchone()
        assert rows_near(c, K, lo, hi) == (first, last)  # the whole table, no TypeError


@pytest.mark.parametrize("form", ["md", "html"])
def test_report_with_cells_where_a_class_has_a_minimum_and_no_measurement(trace, tmp_path, form):
    import polars as pl
    cells = tmp_path / "gemm.parquet"  # cells of the GEMMs only: the other classes' minimum has no measurement
    pl.read_parquet(need(CELLS)).filter(pl.col("kernel").str.starts_with("nvjet")).write_parquet(cells)
    out = tmp_path / f"r.{form}"
    r = CliRunner().invoke(app, ["report", str(trace), "-o", str(out), "--cells", str(cells)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "Byte budget" in text or "byte budget" in text.lower()
    if form == "md":
        budget = text.split("### Byte budget", 1)[1]
        gemm = next(line for line in budget.splitlines() if line.startswith("| gemm |"))
        assert "×1.0" in gemm  # measured against its own, non-zero minimum


@pytest.mark.parametrize("pattern,says", [("a{99999999}", "exceeds"), ("(?:a{500}){500}", "multiply"),
                                          ("x{0,99999999}", "exceeds")])
def test_a_counted_repetition_is_refused_before_it_is_compiled(trace, pattern, says):
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["analyze", str(trace), "--step-regex", pattern])
    one_line_2(r, says, "--step-regex")
    assert time.perf_counter() - t0 < 60  # it took 40 s and 5 GiB before a MemoryError


def test_a_counted_repetition_in_rules_is_refused(trace, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nclass = "gemm"\npattern = "b{1000000}"\n')
    r = CliRunner().invoke(app, ["analyze", str(trace), "--rules", str(rules)])
    assert r.exit_code == 2 and "exceeds" in r.output and "Traceback" not in r.output, r.output


def test_small_counts_still_work(trace):
    r = CliRunner().invoke(app, ["analyze", str(trace), "--step-regex", r"^step .{3,200}$", "--json"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("name,says", [
    ("batch=999999999999999999 tokens=1 context=2048", "batch=999999999999999999, outside 1..100,000"),
    ("batch=1 tokens=1 context=999999999999999999", "context=999999999999999999"),
    ("batch=1 tokens=1 context=2048 tp=99999999999", "tp=99999999999"),
])
def test_budget_of_a_step_name_with_huge_shapes(trace, name, says):
    # the shapes read from the step's name overflowed the budget's 128-bit integers (exit 3)
    with sqlite3.connect(trace) as c:
        c.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text LIKE 'step %'",
                  (f"step phase=decode {name} model=llama-3.1-8b mode=eager",))
    r = CliRunner().invoke(app, ["budget", str(trace), "--cells", str(need(CELLS))])
    one_line_2(r, says)


def test_budget_with_the_shapes_passed_over_a_huge_name(trace):
    with sqlite3.connect(trace) as c:
        c.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text LIKE 'step %'",
                  ("step phase=decode batch=999999999999999999 context=999999999999999999 model=llama-3.1-8b",))
    r = CliRunner().invoke(app, ["budget", str(trace), "--cells", str(need(CELLS)), "--batch", "1",
                                 "--context", "2048", "--json"])
    assert r.exit_code == 0, r.output
