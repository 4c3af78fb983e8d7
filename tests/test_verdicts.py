"""Gaps, floors, compare, what-if graph and the TP model, on the real H200 fixtures."""

from __future__ import annotations

import json

import polars as pl
import pytest
from tests.conftest import CliRunner

import stepscope
from stepscope.analysis import tp as tpm
from stepscope.analysis.compare import compare
from stepscope.analysis.diagnosis import diagnose
from stepscope.analysis.whatif import bundled, graph_constants
from stepscope.api import open_trace
from stepscope.cli import app
from stepscope.render.sections import step_sections
from stepscope.render.sentences import tp_note
from tests.conftest import EXTERNAL, FIXTURES, need, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
ALL_FIXTURES = sorted(FIXTURES.glob("llama8b_*.sqlite"))


def diag(path):
    return diagnose(open_trace(need(path)).inventory)


# Plain SQL: kernels+memops launched from inside the NVTX step range, each with the running max
# of the ends before it, its launching call's start, and whether a sync call returned in its gap.
GAPS_SQL = """
WITH step AS (
  SELECT n.start AS s0, n.end AS s1, ((n.globalTid >> 24) & 16777215) AS pid, n.globalTid AS gtid
  FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
  WHERE coalesce(n.text, s.value) LIKE 'step %' AND n.eventType IN (59, 60)
  ORDER BY n.start LIMIT 1 OFFSET {offset}
), api AS (
  SELECT r.correlationId AS corr, ((r.globalTid >> 24) & 16777215) AS pid, r.start AS ls, r.globalTid AS gtid
  FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.eventClass IN (0, 1)
), acts AS (
  SELECT start, end, correlationId AS corr, ((globalPid >> 24) & 16777215) AS pid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL
  UNION ALL SELECT start, end, correlationId, ((globalPid >> 24) & 16777215), deviceId FROM CUPTI_ACTIVITY_KIND_MEMSET
), mine AS (
  SELECT a.start, a.end, api.ls FROM acts a
  JOIN api ON api.corr = a.corr AND api.pid = a.pid
  JOIN step ON api.gtid = step.gtid AND api.ls BETWEEN step.s0 AND step.s1
), o AS (
  SELECT start, end, ls,
         max(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
  FROM mine
), g AS (
  SELECT start - prev AS gap, ls > prev AS late,
         EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                 WHERE (s.value LIKE 'cudaDeviceSynchronize%' OR s.value LIKE 'cudaStreamSynchronize%'
                        OR s.value LIKE 'cudaEventSynchronize%')
                   AND r.end BETWEEN o.prev AND o.start) AS synced
  FROM o WHERE prev IS NOT NULL AND start > prev
)
SELECT
  sum(CASE WHEN synced AND late THEN 1 ELSE 0 END), sum(CASE WHEN synced AND late THEN gap ELSE 0 END),
  sum(CASE WHEN NOT synced AND late THEN 1 ELSE 0 END), sum(CASE WHEN NOT synced AND late THEN gap ELSE 0 END),
  sum(CASE WHEN NOT late THEN 1 ELSE 0 END), sum(CASE WHEN NOT late THEN gap ELSE 0 END)
FROM g
"""


@pytest.mark.parametrize("path", [EAGER, GRAPH, FIXTURES / "llama8b_prefill_b1_eager.sqlite"], ids=lambda p: p.name)
def test_gap_attribution_matches_sql(path):
    d = diag(path)
    sync_n, sync_ns, host_n, host_ns, dev_n, dev_ns = ro(path).execute(GAPS_SQL.format(offset=0)).fetchone()
    t = {r["kind"]: (r["count"], r["time_ns"]) for r in d.gap_totals.iter_rows(named=True)}
    assert t["sync"] == (sync_n, sync_ns or 0)
    assert t["host_bound"] == (host_n, host_ns or 0)
    assert t["device_side"] == (dev_n, dev_ns or 0)


@pytest.mark.parametrize("path", ALL_FIXTURES + [EXTERNAL / "nsysai_mfu_2gpu_before.sqlite",
                                                 EXTERNAL / "pipit_cloverleaf.sqlite"], ids=lambda p: p.name)
def test_gap_kinds_add_up_to_idle(path):
    d = diag(path)
    total = d.gap_totals.group_by("step").agg(pl.col("time_ns").sum())
    chk = d.inv.steps.select("step", "idle_ns").join(total, on="step")
    assert chk.height == d.inv.steps.height
    assert (chk["time_ns"] == chk["idle_ns"]).all()


def test_eager_step_is_launch_bound_and_graph_step_device_bound():
    e, g = diag(EAGER).floors.row(0, named=True), diag(GRAPH).floors.row(0, named=True)
    assert e["verdict"] == "launch-bound" and g["verdict"] == "device-bound"
    # CPU floor = launch calls × median inter-launch interval, recomputed in SQL
    con = ro(EAGER)
    starts = [r[0] for r in con.execute("""
        SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        JOIN NVTX_EVENTS n ON n.text LIKE 'step %' OR n.textId IN (SELECT id FROM StringIds WHERE value LIKE 'step %')
        WHERE (s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%' OR s.value LIKE 'cudaGraphLaunch%')
          AND r.start BETWEEN n.start AND n.end AND r.globalTid = n.globalTid ORDER BY r.start""")]
    iv = sorted(b - a for a, b in zip(starts, starts[1:]))
    med = (iv[len(iv) // 2 - 1] + iv[len(iv) // 2]) / 2 if len(iv) % 2 == 0 else iv[len(iv) // 2]
    assert e["cpu_floor_ns"] == int(len(starts) * round(med))


def test_compare_eager_vs_graph():
    doc = stepscope.compare(EAGER, GRAPH)  # the library function `stepscope compare` calls
    a, b = doc["a"], doc["b"]
    assert doc["speedup"] == pytest.approx(a["step_time_ns"] / b["step_time_ns"], rel=1e-4)
    assert doc["speedup"] > 3
    assert a["n_launch_calls"] == 420 and b["n_launch_calls"] == 1
    assert doc["kernels_added"] == [] and doc["kernels_removed"] == []
    # the first H200 machine's graph launch lead (0.9 ms) is eight times the others': the
    # bundled point misses it by 14 %, its range holds it, B's own constants reproduce it
    assert doc["predicted_graph_step_low_ns"] <= b["step_time_ns"] <= doc["predicted_graph_step_high_ns"]
    assert abs(doc["with_b_constants"]["prediction_error"]) < 0.02
    assert "launch-bound" in doc["verdict"] and "device-bound" in doc["verdict"]


def test_compare_cli_json_and_fail_above():
    r = CliRunner().invoke(app, ["compare", str(need(EAGER)), str(need(GRAPH)), "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert {"speedup", "predicted_graph_step_time_ns", "classes", "verdict"} <= set(doc)
    # graph → eager is a regression of several hundred percent
    r = CliRunner().invoke(app, ["compare", str(GRAPH), str(EAGER), "--fail-above", "10"])
    assert r.exit_code == 1
    r = CliRunner().invoke(app, ["compare", str(EAGER), str(GRAPH), "--fail-above", "10"])
    assert r.exit_code == 0


def test_compare_warns_for_different_models():
    doc = compare(diag(EAGER), diag(EXTERNAL / "nsysai_mfu_2gpu_before.sqlite"))
    from stepscope.analysis.notes import FEW_SHARED_LAUNCHES
    from stepscope.render.sentences import warning_texts

    # the analysis' note (hardly a kernel name in common), worded by render
    assert [w.code for w in doc["warnings"]] == [FEW_SHARED_LAUNCHES] and doc["warnings"][0]["share"] < 0.01
    assert "different models or workloads" in warning_texts(doc["warnings"])[0]
    assert compare(diag(EAGER), diag(GRAPH))["warnings"] == []


def test_seed_worked_example_tp4_launch_bound():
    # seed 003: 500 kernels × 7 µs = 3.5 ms CPU floor, 10.7 ms device floor at TP=1
    p = tpm.project(500, 7_000, 10.7e6, widths=(1, 2, 4, 8))
    assert [r["step_time_ns"] for r in p.rows] == [10_700_000, 5_350_000, 3_500_000, 3_500_000]
    assert [r["device_floor_ns"] for r in p.rows] == [10_700_000, 5_350_000, 2_675_000, 1_337_500]
    assert p.launch_bound_from_tp == 4


def test_seed_exercise_4():
    # 640 kernels × 8 µs, 4.2 ms device floor: 5.12 ms at TP=1, 2 and 4, launch-bound throughout
    p = tpm.project(640, 8_000, 4.2e6, widths=(1, 2, 4))
    assert [r["step_time_ns"] for r in p.rows] == [5_120_000] * 3
    assert [r["device_floor_ns"] for r in p.rows] == [4_200_000, 2_100_000, 1_050_000]
    assert p.launch_bound_from_tp == 1


def test_tp_numbers_cli_json():
    r = CliRunner().invoke(app, ["tp", "--kernels", "640", "--launch-us", "8", "--device-ms", "4.2",
                                 "--widths", "1,2,4", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["launch_bound_from_tp"] == 1
    assert [x["cpu_floor_ns"] for x in doc["projection"]] == [5_120_000] * 3


def test_tp_trace_projection_reproduces_its_own_width():
    d = diag(GRAPH)
    p = tpm.project_trace(d)
    at1 = p.graph.rows[0]
    assert p.mode == "graph" and p.eager is None and at1["tp"] == 1
    # a graph trace's graph mode at its own width: the what-if with the constants measured on it
    # (launch, gaps by kernel and memop), which reproduces its own step from its own figures
    c = graph_constants(d.inv)
    s = d.inv.steps.row(0, named=True)
    # its CPU floor: the host path, from step begin to the end of the host's own work after the launch
    assert at1["cpu_floor_ns"] == round(c.graph_launch_prep_ns + c.host_after_ns)
    assert at1["measured_step_time_ns"] == s["step_time_ns"]
    assert abs(at1["step_time_ns"] - s["step_time_ns"]) < 0.001 * s["step_time_ns"]
    assert any("estimated" in tp_note(n) for n in p.notes)
    d2 = diag(TP2)
    p2 = tpm.project_trace(d2)
    at2 = next(r for r in p2.eager.rows if r["tp"] == 2)
    assert at2["device_floor_ns"] == p2.inputs["gpu_busy_ns"] - p2.inputs["collective_wait_ns"]
    assert at2["measured_step_time_ns"] == p2.inputs["measured_step_time_ns"]
    assert all(r["measured_step_time_ns"] is None for r in p2.eager.rows if r["tp"] != 2)


def test_default_allreduce_is_the_tp2_fixtures_mean_transfer():
    # the transfer of the i-th NCCL kernel of both devices: last start to first end, in SQL
    n, transfer = ro(TP2).execute("""
        WITH k AS (SELECT deviceId, k.start, k.end, ROW_NUMBER() OVER (PARTITION BY deviceId ORDER BY k.start) AS i
                   FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                   WHERE s.value LIKE 'ncclDevKernel%')
        SELECT count(*), sum(fe - ls) FROM (SELECT i, min(end) AS fe, max(start) AS ls FROM k GROUP BY i)""").fetchone()
    assert tpm.DEFAULT_ALLREDUCE_NS == round(transfer / n)


def test_tp_cli_on_multi_rank_trace():
    r = CliRunner().invoke(app, ["tp", str(need(TP2)), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    # one row per rank, its steps nested
    assert [(x["rank"], x["device"], len(x["steps"])) for x in doc["ranks"]] == [(0, 0, 1), (1, 1, 1)]
    assert sorted(x["pid"] for x in doc["ranks"]) == [798, 799]
    assert {"tp", "cpu_floor_ns", "device_floor_ns", "step_time_ns", "bound", "measured_step_time_ns"} == set(
        doc["projection"][0])
    assert doc["mode"] == "eager" and doc["projection"] == doc["projections"]["eager"]["rows"]
    # graph mode: the CPU floor is one graph launch, so more GPUs keep paying off
    g = doc["projections"]["graph"]
    # the torch engine's captures of the step's memset mode: ≥ 1 memset per 64 kernels (plain SQL)
    n_k, n_m = (ro(need(TP2)).execute(f"SELECT count(*) FROM {t} WHERE deviceId = 0").fetchone()[0]
                for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMSET"))
    c = bundled().point("torch", n_m > 0 and n_m * 64 >= n_k)
    assert g["launch_bound_from_tp"] is None
    assert {r["cpu_floor_ns"] for r in g["rows"]} == {round(c.graph_launch_prep_ns + c.host_after_ns)}
    assert doc["launch_bound_from_tp"] == 1
    (group,) = doc["tp_steps"]
    times = [x["steps"][0]["step_time_ns"] for x in doc["ranks"]]
    assert group["rank_skew_ns"] == doc["rank_skew_ns"] == max(times) - min(times)
    assert group["binding_rank"] == 1 and group["verdict"].startswith("launch-bound: rank 1's host")


def test_analyze_json_has_gaps_launch_floors():
    r = CliRunner().invoke(app, ["analyze", str(need(EAGER)), "--json"])
    step = json.loads(r.stdout)["steps"][0]
    assert set(step["gaps"]) >= {"host_bound", "sync", "device_side"}
    assert step["floors"]["verdict"] == "launch-bound"
    assert step["launch"]["by_api"][0]["count"] > 0


def test_terminal_gap_histogram_folds_every_gap():
    from rich.console import Console

    from stepscope.render.terminal import _render_histogram

    d = diag(EAGER)
    sec = step_sections(d, 0)
    console = Console(record=True, width=100)
    _render_histogram(sec["gaps"]["histogram"], console)
    rows = [line.split("│") for line in console.export_text().splitlines() if "│" in line]
    cols = {"host_bound": 1, "sync": 2, "device_side": 3}
    for kind, i in cols.items():
        n = sum(int(r[i].strip()) for r in rows if r[i].strip().isdigit())
        assert n == sec["gaps"][kind]["count"]
