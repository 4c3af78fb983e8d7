"""Multi-rank traces: collective transfer vs wait, rank device floors, binding rank, rank skew,
each checked against plain SQL over the committed 2×H200 TP=2 captures (and the foreign 2-GPU
exports when present)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.analysis.collectives import collectives, op_name
from stepscope.analysis.diagnosis import diagnose
from stepscope.api import open_trace
from stepscope.cli import app
from tests.conftest import EXTERNAL, FIXTURES, need, ro
from tests.sqlref import union_figures

EAGER_TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
GRAPH_TP2 = FIXTURES / "llama8b_decode_b1_graph_tp2.sqlite"

PID = "((globalPid >> 24) & 16777215)"

# Plain SQL: the i-th NCCL kernel (by start) of every device is one collective; the part all
# devices spend inside it runs from the last start to the first end. Per device: count, time,
# transfer and wait (the rest of each kernel).
SPLIT_SQL = f"""
WITH k AS (
  SELECT deviceId AS dev, {PID} AS pid, k.start, k.end,
         ROW_NUMBER() OVER (PARTITION BY deviceId ORDER BY k.start) AS i
  FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
  WHERE s.value LIKE 'nccl%'
), m AS (SELECT i, max(start) AS ls, min(end) AS fe, count(*) AS n FROM k GROUP BY i)
SELECT k.dev, k.pid, count(*), sum(k.end - k.start), sum(m.fe - m.ls), sum((k.end - k.start) - (m.fe - m.ls)),
       min(m.n), min(m.fe - m.ls)
FROM k JOIN m USING (i) GROUP BY k.dev, k.pid ORDER BY k.dev
"""


def sql_split(path) -> dict[int, dict]:
    out = {}
    for dev, pid, n, t, transfer, wait, min_n, min_overlap in ro(path).execute(SPLIT_SQL):
        assert min_n == 2 and min_overlap >= 0  # every collective found on both devices, overlapping
        out[dev] = {"pid": pid, "n": n, "time": t, "transfer": transfer, "wait": wait}
    return out


def analyze_doc(path) -> dict:
    r = CliRunner().invoke(app, ["analyze", str(need(path)), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("path", [EAGER_TP2, GRAPH_TP2], ids=lambda p: p.stem)
def test_transfer_and_wait_per_rank_match_sql(path):
    want = sql_split(need(path))
    doc = analyze_doc(path)
    assert len(doc["steps"]) == 2
    for s in doc["steps"]:
        w, tp = want[s["device"]], s["tp"]
        assert s["pid"] == w["pid"]
        assert tp["rank"] == s["device"] and tp["ranks"] == 2 and tp["group"] == 0 and tp["split"] is True
        assert (tp["collectives"], tp["collective_ns"]) == (w["n"], w["time"])
        assert tp["collective_transfer_ns"] == w["transfer"] and tp["collective_wait_ns"] == w["wait"]
        assert tp["collective_transfer_ns"] + tp["collective_wait_ns"] == tp["collective_ns"]
        assert tp["split_note"] is None


@pytest.mark.parametrize("path,verdict", [(EAGER_TP2, "launch-bound"), (GRAPH_TP2, "device-bound")],
                         ids=lambda x: getattr(x, "stem", x))
def test_rank_device_floor_is_busy_minus_wait(path, verdict):
    want = sql_split(need(path))
    doc = analyze_doc(path)
    con = ro(path)
    for s in doc["steps"]:
        # the step's activities: launched from inside its NVTX range, on its process
        where = (f"{{t}}.deviceId = {s['device']} AND {{t}}.correlationId IN (SELECT r.correlationId FROM "
                 f"CUPTI_ACTIVITY_KIND_RUNTIME r JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid "
                 f"WHERE n.text LIKE 'step %' AND r.start BETWEEN n.start AND n.end "
                 f"AND ((r.globalTid >> 24) & 16777215) = {s['pid']}) "
                 f"AND (({{t}}.globalPid >> 24) & 16777215) = {s['pid']}")
        busy = union_figures(con, where)["busy"]
        assert s["gpu_busy_ns"] == busy
        # one stream per rank in these captures: nothing runs beside a waiting all-reduce
        assert s["floors"]["device_floor_ns"] == busy - want[s["device"]]["wait"]
        assert s["floors"]["verdict"] == verdict  # every rank of the step


def test_eager_tp2_binding_rank_is_the_one_that_waits_least():
    want = sql_split(need(EAGER_TP2))
    binding = min(want, key=lambda d: want[d]["wait"])
    other = 1 - binding
    doc = analyze_doc(EAGER_TP2)
    for s in doc["steps"]:
        assert s["tp"]["binding_rank"] == binding
        v = s["tp"]["verdict"]
        assert v.startswith(f"launch-bound: rank {binding}'s host")
        assert f"rank {other} waits {want[other]['wait'] / 1e6:.2f} ms in all-reduce" in v
    g = analyze_doc(GRAPH_TP2)["steps"][0]["tp"]["verdict"]
    assert g.startswith("device-bound: rank ")


@pytest.mark.parametrize("path", [EAGER_TP2, GRAPH_TP2], ids=lambda p: p.stem)
def test_rank_skew_is_the_spread_of_one_steps_ranks(path):
    con = ro(need(path))
    # each rank's step: its NVTX range start (or the previous GPU work, none here) to the later
    # of its end and the last GPU activity it launched
    rows = con.execute(f"""
        SELECT n.start, n.end, ((n.globalTid >> 24) & 16777215) AS pid,
               (SELECT max(k.end) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND r.globalTid = n.globalTid
                WHERE {PID.replace('globalPid', 'k.globalPid')} = ((n.globalTid >> 24) & 16777215)
                  AND r.start BETWEEN n.start AND n.end)
        FROM NVTX_EVENTS n WHERE n.text LIKE 'step %'""").fetchall()
    times = [max(e, last) - s for s, e, _, last in rows]
    doc = analyze_doc(path)
    assert sorted(s["step_time_ns"] for s in doc["steps"]) == sorted(times)
    assert {s["tp"]["rank_skew_ns"] for s in doc["steps"]} == {max(times) - min(times)}


@pytest.fixture
def one_rank(tmp_path):
    """The eager TP=2 export with one rank's process alone (the other's rows deleted)."""
    path = tmp_path / "rank0_only.sqlite"
    shutil.copy(need(EAGER_TP2), path)
    con = sqlite3.connect(path)
    pid = con.execute(f"SELECT min({PID}) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    for table, col in (("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"), ("CUPTI_ACTIVITY_KIND_MEMSET", "globalPid"),
                       ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"), ("NVTX_EVENTS", "globalTid")):
        con.execute(f"DELETE FROM {table} WHERE (({col} >> 24) & 16777215) != ?", (pid,))
    con.commit()
    n_nccl = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                            WHERE s.value LIKE 'nccl%'""").fetchone()[0]
    con.close()
    return path, pid, n_nccl


def test_single_rank_of_a_tp_job_cannot_split(one_rank):
    """The step says why it cannot split and keeps its whole busy time as device floor."""
    path, pid, n_nccl = one_rank
    doc = analyze_doc(path)
    (s,) = doc["steps"]
    tp = s["tp"]
    assert s["pid"] == pid and tp["ranks"] == 1 and tp["collectives"] == n_nccl
    assert tp["split"] is False and tp["collective_wait_ns"] is None and tp["binding_rank"] is None
    assert "only one rank's process" in tp["split_note"] and "tp=2" in tp["split_note"]
    assert s["floors"]["device_floor_ns"] == s["gpu_busy_ns"]


def test_single_gpu_trace_has_no_tp_section():
    doc = analyze_doc(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    assert all("tp" not in s for s in doc["steps"])


@pytest.mark.parametrize("name", ["nsysai_mfu_2gpu_before", "nsysai_mfu_2gpu_after"])
def test_foreign_send_recv_split_matches_sql(name):
    """Another project's 2-GPU run: NCCL SendRecv on stream 7 of one process and stream 15 of
    the other, matched by order."""
    path = need(EXTERNAL / f"{name}.sqlite")
    want = sql_split(path)
    c = collectives(open_trace(path).inventory)
    got = c.kernels.join(c.ranks, on=["pid", "device", "rank"]).group_by("device").agg(
        n=pl.len(), transfer=pl.col("transfer_ns").sum(), wait=pl.col("wait_ns").sum())
    for r in got.iter_rows(named=True):
        w = want[r["device"]]
        assert (r["n"], r["transfer"], r["wait"]) == (w["n"], w["transfer"], w["wait"])
    assert c.kernels["matched"].all()


def test_op_names():
    assert op_name("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "all-reduce"
    assert op_name("ncclDevKernel_SendRecv") == "send-recv"
    assert op_name("ncclKernel_ReduceScatter_RING_LL_Sum_half") == "reduce-scatter"
    assert op_name("cross_device_reduce_1stage") == "all-reduce"


def test_diagnosis_tp_frame_on_both_fixtures():
    for path in (EAGER_TP2, GRAPH_TP2):
        d = diagnose(open_trace(need(path)).inventory)
        assert d.tp.height == 2 and d.tp["binding_rank"].n_unique() == 1


def test_terminal_shows_each_ranks_split_and_the_binding_rank():
    want = sql_split(need(EAGER_TP2))
    r = CliRunner().invoke(app, ["analyze", str(EAGER_TP2)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    for dev, w in want.items():
        assert (f"collectives, rank {dev} of 2: 65 kernels, {w['time'] / 1e6:,.3f} ms = transfer "
                f"{w['transfer'] / 1e6:,.3f} ms + waiting for the slowest rank {w['wait'] / 1e6:,.3f} ms") in r.output
        assert f"− collective wait {w['wait'] / 1e6:,.3f} ms" in r.output
    assert r.output.count("TP step (rank ") == 2 and r.output.count("launch-bound: rank 1's host") == 2


def test_compare_tp_eager_vs_graph_per_rank_and_prediction_within_15_percent():
    from stepscope.analysis.compare import compare
    from stepscope.analysis.whatif import bundled

    we, wg = sql_split(need(EAGER_TP2)), sql_split(need(GRAPH_TP2))
    doc = compare(diagnose(open_trace(EAGER_TP2).inventory), diagnose(open_trace(GRAPH_TP2).inventory))
    a, b = doc["a"], doc["b"]
    # each trace is summarized by its binding rank (the one that waits least), never a blend
    ra, rb = min(we, key=lambda d: we[d]["wait"]), min(wg, key=lambda d: wg[d]["wait"])
    assert (a["rank"]["device"], b["rank"]["device"]) == (ra, rb)
    assert a["classes"]["comm"]["time_ns"] == we[ra]["time"] and b["classes"]["comm"]["time_ns"] == wg[rb]["time"]
    assert [r["collective_wait_ns"] for r in a["ranks"]] == [we[0]["wait"], we[1]["wait"]]
    # the what-if: graph launch + (busy - wait) × device ratio + kernels × node gap + memops × memop
    # gap, from SQL figures and the bundled calibration's torch-engine point (no prologue here)
    busy = a["gpu_busy_ns"]
    con = ro(EAGER_TP2)
    n_k = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?", (ra,)).fetchone()[0]
    n_m = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?", (ra,)).fetchone()[0]
    # the point of the torch engine's captures of the step's memset mode (≥ 1 memset per 64 kernels)
    c = bundled().point("torch", n_m * 64 >= n_k > 0 and n_m > 0)
    want = round(c.graph_launch_prep_ns + c.graph_launch_lead_ns + (busy - we[ra]["wait"]) * c.device_ratio
                 + n_k * c.node_gap_ns + n_m * c.memop_gap_ns)
    assert doc["predicted_graph_step_time_ns"] == want
    ref = b["step_time_ns"]  # B's representative step, the one compare quotes
    assert doc["prediction_error"] == round((want - ref) / ref, 4)
    assert abs(doc["prediction_error"]) < 0.15  # +208.7 % when the waiting counted as device work


def test_tp_on_a_single_rank_of_a_tp_job(one_rank):
    path, pid, n_nccl = one_rank
    r = CliRunner().invoke(app, ["tp", str(path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (rank,) = doc["ranks"]
    (st,) = rank["steps"]
    assert rank["pid"] == pid and st["collectives"] == n_nccl and st["split"] is False
    assert "only one rank's process" in st["split_note"]
    assert "tp_steps" not in doc and "rank_skew_ns" not in doc
    assert any("cannot be split" in n and "estimated" in n for n in doc["notes"])
    assert doc["inputs"]["collective_wait_ns"] == 0 and doc["inputs"]["device_floor_ns"] == st["gpu_busy_ns"]


def test_device_floor_is_the_union_with_collectives_cut_to_transfer(tmp_path):
    """A kernel moved onto another stream, inside a waiting all-reduce of rank 0: the time it
    runs beside the wait is device work, so the floor is the union, not busy - wait."""
    path = tmp_path / "overlap.sqlite"
    shutil.copy(need(EAGER_TP2), path)
    con = sqlite3.connect(path)
    nccl = "(SELECT id FROM StringIds WHERE value LIKE 'nccl%')"
    # rank 0's all-reduce that waits longest before rank 1 arrives, and the first other kernel after it
    s0, e0 = con.execute(f"""
        WITH k AS (SELECT deviceId AS dev, start, end, ROW_NUMBER() OVER (PARTITION BY deviceId ORDER BY start) AS i
                   FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN {nccl})
        SELECT a.start, a.end FROM k a JOIN k b ON a.i = b.i AND a.dev = 0 AND b.dev = 1
        ORDER BY b.start - a.start DESC LIMIT 1""").fetchone()
    rid, ks, ke = con.execute(f"""SELECT rowid, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0
                                  AND shortName NOT IN {nccl} AND start > ? ORDER BY start LIMIT 1""", (e0,)).fetchone()
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = ?, end = ?, streamId = 8 WHERE rowid = ?",
                (s0 + 1000, s0 + 1000 + (ke - ks), rid))
    con.commit()
    want = con.execute(f"""
        WITH k AS (SELECT deviceId AS dev, start, end, ROW_NUMBER() OVER (PARTITION BY deviceId ORDER BY start) AS i
                   FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN {nccl}),
             m AS (SELECT i, max(start) AS ls, min(end) AS fe FROM k GROUP BY i),
             a AS (SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0 AND shortName NOT IN {nccl}
                   UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = 0
                   UNION ALL SELECT m.ls, m.fe FROM k JOIN m USING (i) WHERE k.dev = 0),
             o AS (SELECT start, end, max(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING
                                                     AND 1 PRECEDING) AS prev FROM a)
        SELECT sum(max(0, end - max(start, coalesce(prev, start)))) FROM o""").fetchone()[0]
    con.close()
    doc = analyze_doc(path)
    s = next(x for x in doc["steps"] if x["device"] == 0)
    assert s["floors"]["device_floor_ns"] == want
    assert want > s["gpu_busy_ns"] - s["tp"]["collective_wait_ns"]  # the moved kernel overlaps a wait


def test_analysis_gives_the_tp_verdicts_fields_and_render_says_them():
    """The tp frame holds what binds a TP step (binding rank, bound, its floors, the others' waits);
    the sentence is render/sentences.py's, the same in analyze --json and the tp frame's row."""
    from stepscope.render.sentences import tp_sentence

    d = diagnose(open_trace(need(EAGER_TP2)).inventory)
    assert "tp_verdict" not in d.tp.columns
    rows = d.tp.sort("rank").to_dicts()
    b = rows[0]["binding_rank"]
    mine = next(r for r in rows if r["rank"] == b)
    f = d.floors.filter(pl.col("step") == mine["step"]).row(0, named=True)
    for r in rows:
        assert (r["bound"], r["binding_cpu_floor_ns"], r["binding_device_floor_ns"]) == (
            f["verdict"], f["cpu_floor_ns"], f["device_floor_ns"])
        assert r["waits"] == [{"rank": o["rank"], "collective_wait_ns": o["collective_wait_ns"], "wait_op": o["wait_op"]}
                              for o in rows if o["rank"] != b]
    doc = analyze_doc(EAGER_TP2)
    assert [s["tp"]["verdict"] for s in doc["steps"]] == [tp_sentence(r) for r in d.tp.sort("step").to_dicts()]


def test_tp_sentence_wording():
    from stepscope.render.sentences import tp_sentence

    row = {"binding_rank": 1, "bound": "launch-bound", "binding_cpu_floor_ns": 28_820_000,
           "binding_device_floor_ns": 4_070_000,
           "waits": [{"rank": 0, "collective_wait_ns": 13_800_000, "wait_op": "all-reduce"},
                     {"rank": 2, "collective_wait_ns": None, "wait_op": None}]}
    assert tp_sentence(row) == ("launch-bound: rank 1's host (CPU floor 28.82 ms vs device floor 4.07 ms); "
                                "rank 0 waits 13.80 ms in all-reduce, rank 2 waits 0.00 ms in collectives")
    assert tp_sentence({**row, "bound": "device-bound", "waits": []}) == (
        "device-bound: rank 1's GPU (device floor 4.07 ms vs CPU floor 28.82 ms)")
    assert tp_sentence({**row, "binding_rank": None}) is None
