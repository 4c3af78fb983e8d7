"""Host pauses and the CPU floor (DEFINITIONS.md, "Host pauses", "Floors") on the real H200
captures: the pauses' lengths and places against plain SQL over CUPTI_ACTIVITY_KIND_RUNTIME, their
verdicts, the run view and the what-if; the CPU floor within every step of every fixture."""

from __future__ import annotations

from stepscope.pipeline import whatif_of

import polars as pl
import pytest

from stepscope import library
from stepscope.analysis.pauses import PAUSE_FACTOR, PAUSE_MIN_NS
from stepscope.analysis.run import run_view
from stepscope.render.run import time_rows, why
from stepscope.render.units import ms
from stepscope.analysis.step_view import step_diagnosis
from stepscope.render.headline import verdict_line, whatif_sentence
from tests.conftest import FIXTURES, gunzipped, need, ro

MODELS = FIXTURES / "models"
QWEN = MODELS / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz"
DEEPSEEK = MODELS / "deepseek-v2-lite_r32_graph_plain.sqlite.gz"

# The calls stepscope reads (apinames.KEPT), as SQL: a silence is measured between them
KEPT_SQL = " OR ".join(f"s.value LIKE '{p}%'" for p in (
    "cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch", "cudaMemcpy", "cuMemcpy", "cudaMemset",
    "cuMemset", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
    "cuStreamSynchronize", "cuEventSynchronize", "cudaProfilerStart", "cuProfilerStart", "cudaProfilerStop",
    "cuProfilerStop", "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
    "cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiate"))
LAUNCH_SQL = ("(s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%' OR s.value LIKE 'cudaGraphLaunch%' "
              "OR s.value LIKE 'cuGraphLaunch%')")

# Every silence of at least {min} ns between consecutive calls of a thread, with the GPU idle
# (kernels running) for most of it: (thread, silence start, end)
SILENCES_SQL = """
WITH c AS (
  SELECT r.globalTid AS t, r.start, r.end,
         max(r.end) OVER (PARTITION BY r.globalTid ORDER BY r.start, r.end
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
  FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
  WHERE r.eventClass IN (0, 1) AND ({kept})
)
SELECT t, before, start FROM c
WHERE start - before >= {min}
  AND coalesce((SELECT sum(min(k.end, c.start) - max(k.start, c.before)) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                 WHERE k.start < c.start AND k.end > c.before), 0) < (start - before) / 2
ORDER BY start - before DESC
"""


@pytest.fixture(scope="module")
def qwen():
    return library.diagnosis(gunzipped(need(QWEN)))


@pytest.fixture(scope="module")
def deepseek():
    return library.diagnosis(gunzipped(need(DEEPSEEK)))


def _sql_pauses(path, at_least_ns: int) -> list[tuple[int, int, int]]:
    return ro(path).execute(SILENCES_SQL.format(kept=KEPT_SQL, min=at_least_ns)).fetchall()


def _launches_before(path, tid_global: int, begin: int, at: int) -> int:
    return ro(path).execute(
        f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE r.globalTid = ? AND {LAUNCH_SQL} AND r.start >= ? AND r.start < ?", (tid_global, begin, at)).fetchone()[0]


@pytest.mark.parametrize("which,path", [("qwen", QWEN), ("deepseek", DEEPSEEK)])
def test_jit_pauses_match_sql(which, path, request):
    """The long pauses (100 ms and more, the GPU idle through them) inside the steps: the same
    silences, lengths and places as plain SQL over the runtime table finds."""
    d = request.getfixturevalue(which)
    f = gunzipped(path)
    steps = d.inv.steps.select("step", "step_begin", "step_end", "first_start")
    sql = []
    for t, s0, s1 in _sql_pauses(f, 100_000_000):
        inside = steps.filter((pl.col("step_begin") < s0) & (pl.col("step_end") > s1))
        if inside.height:
            sql.append((inside["step"][0], s0, s1, t, inside["first_start"][0]))
    assert len(sql) >= 2  # the JIT compilations of fused_moe_kernel (the engine log warns of them)
    mine = d.pauses.filter(pl.col("pause_ns") >= 100_000_000).sort("pause_start")
    assert mine.select("step", "pause_start", "pause_end").rows() == sorted((s, a, b) for s, a, b, _, _ in sql)
    for (step, s0, s1, t, _), r in zip(sorted(sql, key=lambda x: x[1]), mine.iter_rows(named=True)):
        assert r["pause_ns"] == s1 - s0
        # its place in the step's launch numbering: the step's launch calls started before it
        calls = d.inv.launch_calls.filter(pl.col("step") == step)
        first = calls["start"].min()
        assert r["after_launch"] == _launches_before(f, t, first, s0)
        assert r["n_launches"] == calls.height
        assert r["gpu_idle_ns"] >= PAUSE_MIN_NS
        # the GPU gap it opened, in SQL: from the last end of the kernels that started before the
        # pause ended to the first kernel start after it; a gap of kind host_pause
        pid = t >> 24 & 0xFFFFFF
        g0, g1 = ro(f).execute(
            "SELECT (SELECT max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start < ? AND (globalPid >> 24 & 16777215) = ?),"
            " (SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start >= ? AND (globalPid >> 24 & 16777215) = ?)",
            (s1, pid, s1, pid)).fetchone()
        top = d.top_gaps().filter((pl.col("step") == step) & (pl.col("gap_start") == g0))
        assert top.height == 1 and top["gap_ns"][0] == g1 - g0 and top["kind"][0] == "host_pause"


def test_qwen_step_10_is_host_bound_by_its_pauses(qwen):
    """The 1,042 ms decode step of 17.9 ms GPU work: host-bound by its pauses, named with their
    length and place, never "launch-bound" with CUDA graphs to cut it."""
    f = gunzipped(QWEN)
    v = qwen.verdicts.filter(pl.col("step") == 10).row(0, named=True)
    s = qwen.inv.steps.filter(pl.col("step") == 10).row(0, named=True)
    assert s["step_time_ns"] > 1_000_000_000 and s["gpu_busy_ns"] < 20_000_000 and s["n_launch_calls"] == 881
    assert v["verdict"] == "host-bound" and v["host_bound_on"] == "a host pause"
    # the longest silence inside the step with the GPU idle, in SQL
    t, s0, s1 = next((t, a, b) for t, a, b in _sql_pauses(f, 100_000_000)
                     if s["step_begin"] < a and b < s["step_end"])
    assert v["longest_pause_ns"] == s1 - s0
    k = _launches_before(f, t, qwen.inv.launch_calls.filter(pl.col("step") == 10)["start"].min(), s0)
    line = verdict_line(step_diagnosis(qwen, 10, whatif=whatif_of(qwen)))
    assert line.startswith("decode step is host-bound")
    assert f"a {ms(s1 - s0)} host pause between launch {k} and {k + 1}" in line
    assert "CUDA graphs would cut" not in line and "launch-bound (" not in line.split(":")[0]
    # the GPU's idle time in the pauses is most of the step, and is the host_pause gaps' time
    pause_gaps = qwen.gap_totals.filter((pl.col("step") == 10) & (pl.col("kind") == "host_pause"))["time_ns"][0]
    assert v["host_pause_ns"] == pause_gaps > 0.5 * s["step_time_ns"]
    # the what-if keeps the pauses: a graph replay does not remove a JIT compilation
    assert v["predicted_graph_step_time_ns"] >= v["host_pause_ns"]
    assert "which a graph does not remove" in whatif_sentence(step_diagnosis(qwen, 10, whatif=whatif_of(qwen)))


def test_deepseek_long_steps_are_host_bound_by_pauses(deepseek):
    """The 1,217 ms and 772 ms steps of DeepSeek-V2-Lite: host pauses, not launching."""
    long = deepseek.inv.steps.filter(pl.col("step_time_ns") > 700_000_000).sort("step_time_ns", descending=True)
    assert long.height >= 2
    v = deepseek.verdicts.join(long.select("step"), on="step", how="semi")
    assert v["verdict"].to_list() == ["host-bound"] * v.height
    assert (v["host_bound_on"] == "a host pause").all()
    for r in v.iter_rows(named=True):
        line = verdict_line(step_diagnosis(deepseek, r["step"], whatif=whatif_of(deepseek)))
        assert " step is host-bound" in line and "host pause between launch" in line
        assert "CUDA graphs would cut" not in line
        assert why(r).startswith("host-bound: a ")


def test_run_view_gives_pauses_their_own_row(qwen):
    """Where the run's time went: the pauses' GPU idle is its own row, out of the launching row."""
    view = run_view(qwen)
    t = view["time"]
    g = qwen.gap_totals.group_by("kind").agg(pl.col("time_ns").sum())
    by = {r["kind"]: r["time_ns"] for r in g.iter_rows(named=True)}
    assert t["idle_host_pause_ns"] == by["host_pause"] > 900_000_000
    assert t["idle_host_bound_ns"] == by["host_bound"]
    rows = dict(time_rows(view))
    assert rows["GPU idle: host pauses (JIT compilation, GC, Python; no launch)"] == by["host_pause"]
    assert sum(ns for _, ns in time_rows(view)) == view["wall_ns"]
    assert view["host_pauses"][0]["index"] == 10


def test_pause_threshold_is_relative_and_absolute(qwen, deepseek):
    """Every pause is at least PAUSE_MIN_NS and PAUSE_FACTOR × its step's median launch interval,
    with the GPU idle at least PAUSE_MIN_NS in it; the steady decode steps (CUDA-graph replays)
    have none."""
    for d in (qwen, deepseek):
        p = d.pauses.join(d.launch.select("step", "interval_median_ns"), on="step")
        assert (p["pause_ns"] >= PAUSE_MIN_NS).all()
        assert (p["pause_ns"] >= PAUSE_FACTOR * p["interval_median_ns"].fill_null(0)).all()
        assert (p["gpu_idle_ns"] >= PAUSE_MIN_NS).all()
        full = d.inv.steps.filter(pl.col("graph_mode") == "full")["step"]
        assert not p["step"].is_in(full.implode()).any()


def _all_fixtures():
    out = sorted(p for p in FIXTURES.rglob("*.sqlite") if "columnar" not in p.parts or p.suffix == ".sqlite")
    return out + sorted(FIXTURES.rglob("*.sqlite.gz"))


@pytest.mark.parametrize("path", _all_fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_cpu_floor_never_above_the_step(path):
    """Equation 1.3 says a step cannot be shorter than its CPU floor: on every step of every
    committed fixture the floor is within the step (traced and untraced), and the verdicts are
    Equation 1.3's (Diagnosis.self_check)."""
    p = gunzipped(path) if path.suffix == ".gz" else path
    if path.name == "llama-3.1-8b_serve_sigint.sqlite.gz":
        # start-up only: no engine step, so no floor to check (tests/test_capture_defects.py)
        from stepscope.errors import InputError

        with pytest.raises(InputError, match="no engine step found"):
            library.diagnosis(p)
        return
    d = library.diagnosis(p)
    v = d.verdicts
    assert v.height == d.inv.steps.height
    assert (v["cpu_floor_ns"] <= v["step_time_ns"]).all()
    u = v.filter(pl.col("untraced_cpu_floor_ns").is_not_null())
    assert (u["untraced_cpu_floor_ns"] <= u["cpu_floor_ns"]).all()
    d.self_check()


def test_fp8_async_step_launched_ahead_is_not_launch_bound():
    """A 6.1 ms eager step of the FP8 run whose 405 launches were issued while the steps before
    it ran (async scheduling): N × median interval (15 ms) is more than the step; its CPU floor is
    the host's launching inside the step, and the step is not launch-bound."""
    f = gunzipped(need(MODELS / "llama-3.1-8b-fp8_r32_graph_plain.sqlite.gz"))
    d = library.diagnosis(f)
    s = d.inv.steps.join(d.verdicts.select("step", "verdict", "cpu_floor_ns", "t_launch_ns", "launch_host_ns",
                                           "launches_ahead"), on="step")
    ahead = s.filter(pl.col("n_launch_calls") * pl.col("t_launch_ns") > pl.col("step_time_ns"))
    assert ahead.height >= 1
    for r in ahead.iter_rows(named=True):
        # most of its launch calls started before the step began (counted in SQL from its first)
        first = d.inv.launch_calls.filter(pl.col("step") == r["step"])["start"].min()
        early = ro(f).execute(
            f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            f"WHERE {LAUNCH_SQL} AND r.start >= ? AND r.start < ?", (first, r["step_begin"])).fetchone()[0]
        assert early > r["n_launch_calls"] // 2 and r["launches_ahead"] == early
        assert r["cpu_floor_ns"] == r["launch_host_ns"] <= r["step_time_ns"]
        assert r["verdict"] != "launch-bound"


@pytest.mark.parametrize("which,path", [("qwen", QWEN), ("deepseek", DEEPSEEK)])
def test_long_pauses_wait_for_the_kernels_vllm_says_it_compiled(which, path, request):
    """vLLM's own JIT monitor (the engine log beside the capture) names the Triton kernels it
    compiled during inference; the long pauses (100 ms and more) are the GPU waiting for exactly
    those kernels."""
    import re

    d = request.getfixturevalue(which)
    log = path.with_name(path.name.replace(".sqlite.gz", ".engine.log")).read_text(errors="replace")
    compiled = set(re.findall(r"JIT compilation during inference: (\w+)", log))
    assert compiled
    waited = set(d.pauses.filter(pl.col("pause_ns") >= 100_000_000)["next_kernel"].to_list())
    assert waited == compiled


def _two_launch_step(f) -> tuple[int, int, int]:
    """(globalTid, start of the first launch, end of the second's kernel) of the longest silence
    between two consecutive launches of one thread in the SIGINT capture's start-up, in SQL."""
    row = ro(f).execute(
        f"WITH l AS (SELECT r.globalTid AS t, r.start, r.end, r.correlationId AS c, "
        f"lead(r.start) OVER (PARTITION BY r.globalTid ORDER BY r.start) AS nstart, "
        f"lead(r.correlationId) OVER (PARTITION BY r.globalTid ORDER BY r.start) AS nc "
        f"FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId WHERE {LAUNCH_SQL}) "
        f"SELECT l.t, l.start, k2.end FROM l JOIN CUPTI_ACTIVITY_KIND_KERNEL k1 ON k1.correlationId = l.c "
        f"JOIN CUPTI_ACTIVITY_KIND_KERNEL k2 ON k2.correlationId = l.nc "
        f"ORDER BY l.nstart - l.end DESC LIMIT 1").fetchone()
    return row[0], row[1], row[2]


def test_a_two_launch_step_pause_is_measured_against_its_launch_call(tmp_path):
    """A step of two launches around a 2.57 s silence (the SIGINT capture's start-up, made a step
    by an NVTX range put around those two launches in a copy: the capture itself has no engine
    step): its own median interval cannot measure the silence (it is that interval): it is a
    host pause against the launch call, the step is host-bound by it, and its CPU floor is no
    longer the silence."""
    import shutil
    import sqlite3

    src = gunzipped(need(FIXTURES / "vllm_serve" / "llama-3.1-8b_serve_sigint.sqlite.gz"))
    tid, t0, t1 = _two_launch_step(src)
    f = tmp_path / "two_launch.sqlite"
    shutil.copy(src, f)
    con = sqlite3.connect(f)
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, 'two launches', ?)",
                (t0 - 1000, t1 + 1000, tid))
    con.commit()
    con.close()
    d = library.diagnosis(f, step_regex="^two launches$", cache=False)
    assert d.inv.steps.height == 1
    s = d.inv.steps.row(0, named=True)
    assert s["n_launch_calls"] == 2 and s["step_time_ns"] > 2_000_000_000
    v = d.verdicts.row(0, named=True)
    calls = d.inv.launch_calls.filter(pl.col("step") == s["step"]).sort("start")
    # the silence in SQL: the calls the reader keeps, between the two launches' starts
    t_global = ro(f).execute(
        f"SELECT r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE {LAUNCH_SQL} AND r.start = ?", (calls["start"][0],)).fetchone()[0]
    before, after = ro(f).execute(
        f"SELECT max(r.end), (SELECT min(r2.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r2 JOIN StringIds s2 "
        f"ON s2.id = r2.nameId WHERE r2.globalTid = ?1 AND r2.start > max(r.end) AND ({KEPT_SQL.replace('s.', 's2.')})) "
        f"FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE r.globalTid = ?1 AND r.start <= ?2 AND ({KEPT_SQL})", (t_global, calls["start"][0])).fetchone()
    assert v["verdict"] == "host-bound" and v["host_bound_on"] == "a host pause"
    assert v["longest_pause_ns"] == after - before and v["longest_pause_after_launch"] == 1
    assert v["cpu_floor_ns"] < 1_000_000 < v["longest_pause_ns"]
