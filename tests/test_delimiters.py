"""Step delimiters other than NVTX ranges, on copies of the real H200 fixtures."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from stepscope.api import open_trace
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
