"""Processes that share a device in time (issue 30): three processes on two GPUs, the third a copy
of rank 1 shifted by 1 µs (built from the real TP=2 fixture with SQL), must not get silent
per-process figures: a warning names the processes and the GPU, in analyze and in tp."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, need

TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
SHIFT_NS, NEW_PID = 1000, 999


def _copy_process(c: sqlite3.Connection, gpid: int, new: int) -> None:
    """Every row of process `gpid` again as process `new`, SHIFT_NS later (correlation ids moved)."""
    corr = c.execute("SELECT MAX(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] + 1
    thread = f"globalTid BETWEEN {gpid} AND {gpid + (1 << 24) - 1}"
    for t in TABLES:
        cols = [r[1] for r in c.execute(f"PRAGMA table_info({t})")]
        if "globalPid" in cols:
            where = f"globalPid = {gpid}"
        elif "globalTid" in cols:
            where = thread
        else:
            continue
        moved = {"start": f"start + {SHIFT_NS}", "end": f"end + {SHIFT_NS}", "globalPid": str(new),
                 "globalTid": f"globalTid - {gpid} + {new}", "endGlobalTid": f"endGlobalTid - {gpid} + {new}",
                 "correlationId": f"correlationId + {corr}"}
        exprs = [moved.get(col, col) if col != "rowid" else col for col in cols]
        if "id" in cols:  # a primary key: new rows get new ones
            exprs[cols.index("id")] = "NULL"
        c.execute(f"INSERT INTO {t} ({', '.join(cols)}) SELECT {', '.join(exprs)} FROM {t} WHERE {where}")
    c.execute("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, 'python3')", (new, NEW_PID))


@pytest.fixture
def three(tmp_path):
    p = tmp_path / "three.sqlite"
    shutil.copy(need(TP2), p)
    with sqlite3.connect(p) as c:
        (gpid, pid, dev), = c.execute("SELECT k.globalPid, p.pid, k.deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN "
                                      "PROCESSES p USING (globalPid) WHERE k.deviceId = 1 GROUP BY 1").fetchall()
        new = gpid - (pid << 24) + (NEW_PID << 24)
        _copy_process(c, gpid, new)
        n = c.execute("SELECT COUNT(DISTINCT globalPid), COUNT(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL"
                      ).fetchone()
    assert n == (3, 2)
    return p, pid, dev


def test_analyze_names_the_processes_sharing_a_gpu(three):
    p, pid, dev = three
    r = CliRunner().invoke(app, ["analyze", str(p), "--json"])
    assert r.exit_code == 0, r.output
    said = [w for w in json.loads(r.stdout)["warnings"] if "same times" in w]
    assert len(said) == 1, said
    assert f"processes {pid}, {NEW_PID}" in said[0] and f"GPU {dev}" in said[0]


def test_tp_does_not_report_the_1us_step_silently(three):
    p, pid, dev = three
    r = CliRunner().invoke(app, ["tp", str(p), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any(f"processes {pid}, {NEW_PID}" in w for w in doc.get("warnings", [])), doc.get("warnings")
    r = CliRunner().invoke(app, ["tp", str(p)])
    assert r.exit_code == 0 and f"processes {pid}, {NEW_PID} ran kernels at the same times" in r.output.replace("\n", " ")


def test_the_real_tp2_trace_gets_no_such_warning():
    r = CliRunner().invoke(app, ["analyze", str(need(TP2)), "--json"])
    assert r.exit_code == 0
    assert not [w for w in json.loads(r.stdout)["warnings"] if "same times" in w]
