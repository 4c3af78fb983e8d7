"""Step delimiters other than NVTX ranges, on copies of the real H200 fixtures."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from tests.conftest import CliRunner

from stepscope.api import open_trace
from stepscope.cli import app
from stepscope.errors import InputError
from tests.conftest import FIXTURES, need, ro

NOMATCH = r"^no step range has this name$"


def _copy(tmp_path, name):
    p = tmp_path / name
    shutil.copy(need(FIXTURES / name), p)
    return p


def test_capture_range_when_no_nvtx_step_matches():
    """nsys records the cudaProfilerStart of the capture range (the stop ends recording): the
    range runs from that call to the end of the trace, and holds the whole step."""
    path = need(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    s = open_trace(path, step_regex=NOMATCH).table.row(0, named=True)
    assert s["delimiter"] == "capture"
    n = ro(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert s["n_kernels"] == n
    nvtx = open_trace(path).table.row(0, named=True)
    assert s["gpu_busy_ns"] == nvtx["gpu_busy_ns"] and s["n_launch_calls"] == nvtx["n_launch_calls"]


def test_graph_launch_delimits_a_replay(tmp_path):
    p = _copy(tmp_path, "llama8b_decode_b1_graph.sqlite")
    con = sqlite3.connect(p)
    con.execute("""DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN
                   (SELECT id FROM StringIds WHERE value LIKE 'cuProfilerStart%')""")
    con.commit()
    con.close()
    s = open_trace(p, step_regex=NOMATCH).table.row(0, named=True)
    assert s["delimiter"] == "graph" and s["name"].startswith("cudaGraphLaunch")
    n, n_graph = ro(p).execute(
        "SELECT count(*), sum(graphNodeId IS NOT NULL) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    assert s["n_kernels"] == n == n_graph == 420
    assert s["n_launch_calls"] == 1
    # the step is named by its launch call: a string like any step name (it was the API name's
    # categorical, and the untraced estimate's and the engine anatomy's name tests failed on it)
    r = CliRunner().invoke(app, ["analyze", str(p), "--step-regex", NOMATCH, "--json", "--no-cache"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"][0]["delimiter"] == "graph"


def test_graph_level_tracing_is_reported_not_invented(tmp_path):
    p = _copy(tmp_path, "llama8b_decode_b1_graph.sqlite")
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER, end INTEGER, deviceId INTEGER, "
                "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, graphId INTEGER)")
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, 0, 7, ?, 0, 1)",
                    [(1000, 2000, 1), (3000, 4000, 2)])
    con.commit()
    a = open_trace(p)
    assert any("per-kernel inventory unavailable for 2 graph launches" in w for w in a.warnings)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="cuda-graph-trace=node"):
        open_trace(p)


def test_step_range_with_launch_calls_but_no_recorded_gpu_work(tmp_path):
    """A later step range whose only launch call has no kernel in the trace (a trimmed capture)
    is skipped with a warning; the real step keeps exactly its own launch calls."""
    p = _copy(tmp_path, "llama8b_decode_b1_eager.sqlite")
    con = sqlite3.connect(p)
    last = con.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    cols = [r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")]
    step = dict(zip(cols, con.execute("SELECT * FROM NVTX_EVENTS WHERE eventType = 59 AND text LIKE 'step%'").fetchone()))
    step.update(start=last + 1_000, end=last + 100_000)
    con.execute(f"INSERT INTO NVTX_EVENTS ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                [step[c] for c in cols])
    rcols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")]
    call = dict(zip(rcols, con.execute("""SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN
        (SELECT id FROM StringIds WHERE value LIKE 'cuLaunchKernel%') LIMIT 1""").fetchone()))
    call.update(start=last + 2_000, end=last + 3_000, correlationId=10**9)
    con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME ({','.join(rcols)}) VALUES ({','.join('?' * len(rcols))})",
                [call[c] for c in rcols])
    con.commit()
    con.close()
    a = open_trace(p)
    assert a.warnings == ["1 step range(s) launched no GPU work and were skipped"]
    s = a.table.row(0, named=True)
    assert a.table.height == 1
    original = ro(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    launches = original.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%'""").fetchone()[0]
    assert s["n_launch_calls"] == launches == 420


@pytest.mark.parametrize("name", ["vllm/llama8b_decode_b1_eager.sqlite", "vllm/qwen7b_decode_b1_eager.sqlite",
                                  "llama8b_decode_b1_eager.sqlite"])
def test_an_open_capture_window_ends_at_the_last_activity_or_its_launch(name):
    """An open capture range (steps._close_open_windows) ends at its process's last GPU activity
    or the end of a call that launched one, whichever is later; against plain SQL. The vLLM
    fixtures each have a launch call that returns after the last kernel ended."""
    import polars as pl

    from stepscope.analysis import steps
    from stepscope.analysis.steps import api_flags
    from stepscope.pipeline import read

    path = need(FIXTURES / name)
    con = ro(path)
    try:
        pid = "(globalPid / 16777216 % 16777216)"
        tid_pid = "(globalTid / 16777216 % 16777216)"
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        acts = " UNION ALL ".join(f"SELECT {pid} AS pid, correlationId AS corr, end FROM {tb}" for tb in (
            "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if tb in tables)
        want = dict(con.execute(
            f"WITH a AS ({acts}), c AS (SELECT {tid_pid} AS pid, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            f"WHERE EXISTS (SELECT 1 FROM a WHERE a.pid = {tid_pid} AND a.corr = r.correlationId)) "
            "SELECT pid, max(end) FROM (SELECT pid, end FROM a UNION ALL SELECT pid, end FROM c) GROUP BY pid"
        ).fetchall())
        later = con.execute(
            f"WITH a AS ({acts}), last AS (SELECT pid, max(end) e FROM a GROUP BY pid) SELECT count(*) FROM "
            f"CUPTI_ACTIVITY_KIND_RUNTIME r JOIN last ON last.pid = {tid_pid} WHERE r.end > last.e AND EXISTS "
            f"(SELECT 1 FROM a WHERE a.pid = {tid_pid} AND a.corr = r.correlationId)").fetchone()[0]
    finally:
        con.close()
    t = read(path)
    names = t.strings.filter(pl.col("id").is_in(t.api["name_id"].unique().drop_nulls().implode()))
    api = api_flags(t.api, dict(zip(names["id"].to_list(), names["value"].to_list())))
    if name.startswith("vllm/"):
        assert later >= 1  # the branch where a call outlasts every activity of its process
    pids = sorted(want)
    open_windows = pl.DataFrame({"pid": pids, "w_start": [0] * len(pids), "w_end": [steps.OPEN_END] * len(pids)},
                                schema={"pid": t.api.schema["pid"], "w_start": pl.Int64, "w_end": pl.Int64})
    got = steps._close_open_windows(t, api, open_windows)
    assert dict(zip(got["pid"].to_list(), got["w_end"].to_list())) == want
