"""Per-step figures on foreign real traces, checked against plain SQL over the same kernels."""

from __future__ import annotations

import polars as pl
import pytest

from stepscope.api import open_trace
from tests.conftest import EXTERNAL, FIXTURES, need, ro
from tests.sqlref import PID, union_figures


def test_every_external_export_analyzes(external):
    a = open_trace(external)
    a.inventory.self_check()
    s = a.table
    assert s.height >= 1
    con = ro(external)
    total = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    # steps never double-count a kernel
    assert s["n_kernels"].sum() <= total
    assert (s["idle_ns"] >= 0).all() and (s["gpu_busy_ns"] <= s["gpu_span_ns"]).all()


@pytest.mark.parametrize("name,period", [("pipit_cloverleaf.sqlite", 150), ("pipit_saxpy_2022.sqlite", 4)])
def test_marker_free_traces_split_at_their_repeat_period(name, period):
    path = need(EXTERNAL / name)
    a = open_trace(path)
    s = a.table
    # independent count of iterations: the most common number of launches per kernel name
    steps = ro(path).execute("""
        SELECT c FROM (SELECT demangledName, count(*) c FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1)
        GROUP BY c ORDER BY count(*) DESC, c LIMIT 1""").fetchone()[0]
    assert (s["delimiter"] == "period").all()
    assert s.height == steps
    assert s["name"].str.starts_with(f"period {period} ").all()


@pytest.mark.parametrize("name", ["pipit_cloverleaf.sqlite", "pipit_saxpy_2022.sqlite"])
def test_busy_span_idle_match_sql_union(name):
    """Each step's activities occupy one contiguous time window on one stream: SQL recomputes
    count, span and idle from the raw tables over that window."""
    path = need(EXTERNAL / name)
    a = open_trace(path)
    con = ro(path)
    for r in a.table.iter_rows(named=True):
        where = (f"{{t}}.deviceId = {r['device']} AND {PID.format(c='{t}.globalPid')} = {r['pid']} "
                 f"AND {{t}}.start >= {r['first_start']} AND {{t}}.start < {r['last_end']}")
        ref = union_figures(con, where)
        k = con.execute(
            f"SELECT count(*), sum(end-start) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE {where.format(t='k')}"
        ).fetchone()
        assert (r["n_kernels"], r["kernel_time_sum_ns"]) == k
        assert r["gpu_span_ns"] == ref["span"]
        assert r["idle_ns"] == ref["idle"]
        assert r["gpu_busy_ns"] == ref["busy"]


def test_launch_calls_of_period_steps_match_sql():
    path = need(EXTERNAL / "pipit_cloverleaf.sqlite")
    a = open_trace(path)
    con = ro(path)
    for r in a.table.iter_rows(named=True):
        n, ns = con.execute(f"""
            SELECT count(*), sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
            JOIN StringIds s ON s.id = r.nameId
            WHERE s.value LIKE 'cudaLaunch%' AND r.correlationId IN (
                SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL
                WHERE start >= {r['first_start']} AND start < {r['last_end']})""").fetchone()
        assert (r["n_launch_calls"], r["launch_call_ns"]) == (n, ns)


def test_two_process_trace_keeps_processes_and_devices_apart():
    path = need(EXTERNAL / "nsysai_mfu_2gpu_before.sqlite")
    a = open_trace(path)
    s = a.table
    pairs = s.select("pid", "device").unique()
    assert pairs.height == 2  # one process per GPU
    con = ro(path)
    ref = {(p, d) for p, d in con.execute(
        f"SELECT DISTINCT {PID.format(c='globalPid')}, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    assert set(map(tuple, pairs.rows())) == ref
    # NCCL kernels are comm, FA kernels attention, and nothing is silently absorbed
    cls = a.inventory.classes.group_by("class").agg(pl.col("count").sum())
    got = dict(cls.rows())
    assert got["comm"] > 0 and got["attention_prefill"] > 0 and got["gemm"] > 0


SYNC_CALLS_SQL = """
    SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
    WHERE r.eventClass IN (0, 1) AND (s.value LIKE '%Synchronize%'
          OR ((s.value GLOB 'cudaMemcpy*' OR s.value GLOB 'cuMemcpy*') AND s.value NOT LIKE '%Async%'))"""


@pytest.mark.parametrize("path", [*EXTERNAL.glob("*.sqlite"), FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"],
                         ids=lambda p: p.name)
def test_release_input_keeps_what_the_diagnosis_reads(path):
    """A one-shot caller's analysis (memory=ONE_SHOT) empties the trace's event frames and
    keeps only the synchronizing API calls, and diagnoses every gap the same as a full one."""
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.analysis.memory import ONE_SHOT, ONE_SHOT_ACT_COLUMNS
    from stepscope.ingest import read_trace

    need(path)
    full = analyze_trace(read_trace(path, cache=False))
    trace = read_trace(path, cache=False)
    lean = analyze_trace(trace, memory=ONE_SHOT)
    for frame in ("kernels", "api", "memops"):  # let go for good: an access is a caller's mistake
        with pytest.raises(AttributeError, match="let go once the analysis held its rows"):
            getattr(trace, frame)
    syncs = ro(path).execute(SYNC_CALLS_SQL).fetchone()[0]
    assert lean.api.height == syncs and lean.api["is_sync"].all()
    assert full.api.height > syncs
    assert lean.launch_calls.equals(full.launch_calls)
    assert lean.acts.columns == list(ONE_SHOT_ACT_COLUMNS)
    assert lean.acts.equals(full.acts.select(ONE_SHOT_ACT_COLUMNS))
    assert lean.steps.equals(full.steps) and lean.kernels.equals(full.kernels)
    g_full, g_lean = diagnose(full).gaps, diagnose(lean).gaps
    assert g_lean.height == g_full.height > 0
    assert g_lean.equals(g_full)
