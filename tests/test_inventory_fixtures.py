"""The H200 step fixtures: every figure of DEFINITIONS.md against plain SQL over the export."""

from __future__ import annotations

import polars as pl
import pytest

from stepscope.api import open_trace
from tests.conftest import FIXTURES, need, ro

ALL = sorted(FIXTURES.glob("llama8b_*.sqlite"))

# Step = the NVTX `step ...` range; its activities = kernels/memsets whose launching call
# (same pid, same correlationId) starts inside it on the range's thread.
STEP_SQL = """
WITH step AS (
  SELECT n.start AS s0, n.end AS s1, n.globalTid AS gtid
  FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
  WHERE coalesce(n.text, s.value) LIKE 'step %' AND n.eventType IN (59, 60) AND n.globalTid = {gtid}
), api AS (
  SELECT r.correlationId AS corr, r.globalTid AS gtid, r.start AS ls, r.end AS le, s.value AS name
  FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId WHERE r.eventClass IN (0, 1)
), acts AS (
  SELECT start, end, correlationId AS corr, (globalPid >> 24) & 16777215 AS pid, 1 AS is_kernel
  FROM CUPTI_ACTIVITY_KIND_KERNEL
  UNION ALL
  SELECT start, end, correlationId, (globalPid >> 24) & 16777215, 0 FROM CUPTI_ACTIVITY_KIND_MEMSET
), mine AS (
  SELECT a.* FROM acts a JOIN api ON api.corr = a.corr AND ((api.gtid >> 24) & 16777215) = a.pid
  JOIN step ON api.gtid = step.gtid AND api.ls BETWEEN step.s0 AND step.s1
), o AS (
  SELECT start, end, is_kernel,
         max(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
  FROM mine
)
SELECT sum(is_kernel), sum(CASE WHEN is_kernel = 1 THEN end - start ELSE 0 END),
       max(end) - min(start),
       sum(CASE WHEN prev IS NOT NULL AND start > prev THEN start - prev ELSE 0 END),
       (SELECT count(*) FROM api JOIN step ON api.gtid = step.gtid AND api.ls BETWEEN step.s0 AND step.s1
        WHERE api.name LIKE 'cudaLaunch%' OR api.name LIKE 'cuLaunch%' OR api.name LIKE 'cudaGraphLaunch%'),
       (SELECT sum(api.le - api.ls) FROM api JOIN step ON api.gtid = step.gtid AND api.ls BETWEEN step.s0 AND step.s1
        WHERE api.name LIKE 'cudaLaunch%' OR api.name LIKE 'cuLaunch%' OR api.name LIKE 'cudaGraphLaunch%'),
       (SELECT s0 FROM step), (SELECT s1 FROM step), max(end)
FROM o
"""


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_step_figures_match_sql(path):
    a = open_trace(need(path))
    a.inventory.self_check()
    con = ro(path)
    for r in a.table.iter_rows(named=True):
        gtid = con.execute(
            "SELECT globalTid FROM NVTX_EVENTS WHERE start = ? AND end = ?", (r["w_start"], r["w_end"])).fetchone()[0]
        n, ksum, span, idle, n_launch, launch_ns, s0, s1, last = con.execute(STEP_SQL.format(gtid=gtid)).fetchone()
        assert r["n_kernels"] == n
        assert r["kernel_time_sum_ns"] == ksum
        assert r["gpu_span_ns"] == span
        assert r["idle_ns"] == idle
        assert r["gpu_busy_ns"] == span - idle
        assert r["n_launch_calls"] == n_launch
        assert r["launch_call_ns"] == launch_ns
        # one step per device: nothing queued before it, so it runs from the range start to the
        # later of the range end and its last GPU activity
        assert r["step_time_ns"] == max(s1, last) - s0


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_other_holds_at_most_two_percent(path):
    a = open_trace(need(path))
    for step in a.steps:
        total = step.classes["time_ns"].sum()
        other = step.classes.filter(pl.col("class") == "other")["time_ns"].sum()
        assert other <= 0.02 * total


def test_decode_step_inventory_b1_eager():
    """32 layers; the per-layer pattern: 4 GEMMs + 2 split-K reduces + cuDNN SDPA and its
    reduction + 2 norms + RoPE + KV write + SiLU·mul = 13 kernels; the counts from SQL."""
    path = need(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    s = open_trace(path).steps[0]
    assert (s.layers, s.kernels_per_layer) == (32, 13)
    con = ro(path)
    by_name = dict(con.execute("""SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                  JOIN StringIds s ON s.id = k.shortName GROUP BY 1""").fetchall())
    cls = dict(zip(s.classes["class"], s.classes["count"]))
    assert cls["kv_cache_write"] == by_name["reshape_and_cache_kernel"] == 32
    assert cls["rope"] == by_name["rotary_embedding_kernel"] == 32
    assert cls["activation"] == by_name["act_and_mul_kernel"] == 32
    assert cls["norm"] == by_name["rms_norm_kernel"] + by_name["fused_add_rms_norm_kernel"] == 65
    assert cls["splitk_reduce"] == by_name["splitKreduce_kernel"] == 64
    assert cls["embedding"] == 1 and cls["sampling"] == 1
    assert s.phase == "decode" and "attention_prefill" not in cls


def test_prefill_attention_by_step_shape():
    s = open_trace(need(FIXTURES / "llama8b_prefill_b1_eager.sqlite")).steps[0]
    cls = dict(zip(s.classes["class"], s.classes["count"]))
    assert s.phase == "prefill" and cls["attention_prefill"] == 32 and "attention_decode" not in cls


def test_api_step_objects_and_pandas():
    pytest.importorskip("pandas", reason="pandas is the stepscope[pandas] extra")
    pytest.importorskip("pyarrow", reason="pyarrow is the stepscope[pandas] extra")
    a = open_trace(need(FIXTURES / "llama8b_decode_b8_graph.sqlite"))
    assert len(a.steps) == 1
    st = a.steps[0]
    assert st.delimiter == "nvtx" and st.name.startswith("step phase=decode batch=8")
    df = st.to_pandas()
    assert df["count"].sum() == st.n_kernels + st.classes.filter(pl.col("class") == "memops")["count"].sum()
    assert a.to_pandas().shape[0] == 1


# A step's launch calls: the launch calls on the step range's thread that start inside it.
LAUNCH_SQL = """
SELECT r.correlationId, r.start, r.end, s.value
FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
WHERE r.eventClass IN (0, 1) AND r.globalTid = ? AND r.start BETWEEN ? AND ?
  AND (s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%' OR s.value LIKE 'cudaGraphLaunch%')
ORDER BY r.start
"""


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_launch_calls_are_each_steps_calls_in_start_order(path):
    """Every step's calls, call by call, against SQL; the frame in (step, start) order (the TP=2
    traces' steps interleave across devices, so that order is built, not found)."""
    a = open_trace(need(path))
    calls = a.inventory.launch_calls
    con = ro(path)
    assert calls.select("step", "start").equals(calls.select("step", "start").sort("step", "start"))
    for r in a.table.iter_rows(named=True):
        gtid = con.execute(
            "SELECT globalTid FROM NVTX_EVENTS WHERE start = ? AND end = ?", (r["w_start"], r["w_end"])).fetchone()[0]
        want = con.execute(LAUNCH_SQL, (gtid, r["w_start"], r["w_end"])).fetchall()
        got = calls.filter(pl.col("step") == r["index"]).select("corr", "start", "end", "api_name").rows()
        assert got == want and len(want) == r["n_launch_calls"] > 0
