"""Several reports of one run (issue 29): the TP=2 fixtures split per rank into separate SQLite
files (with SQL, in tmp_path: benchmarks/split_reports.py) give the figures of the one export
that holds both ranks; copies under other host names make a run of 8 reports, which a dask
LocalCluster of 2 workers analyzes to exactly the serial result; a damaged report, a worker that
dies and one that hangs each end in one line naming the report."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest

from stepscope import distribute, library
from stepscope.errors import StepscopeError
from stepscope.render.reports_run import run_dict
from tests.conftest import FIXTURES, ROOT, CliRunner, ro, sha256

_spec = importlib.util.spec_from_file_location("stepscope_split_reports", ROOT / "benchmarks" / "split_reports.py")
split = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(split)

TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
TP2_GRAPH = FIXTURES / "llama8b_decode_b1_graph_tp2.sqlite"
SAME = ("step_time_ns", "gpu_busy_ns", "collectives", "collective_ns", "collective_transfer_ns",
        "collective_wait_ns", "split", "split_note", "cpu_floor_ns", "device_floor_ns", "verdict")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """4 hosts × the 2 ranks of the eager TP=2 fixture: 8 reports of one TP=8 run."""
    d = tmp_path_factory.mktemp("run")
    return split.run_of(TP2, d, hosts=4)


@pytest.fixture(scope="module")
def serial_doc(run_dir):
    real = distribute.have_dask
    distribute.have_dask = lambda: False
    try:
        return run_dict(library.run(run_dir, cache=False))
    finally:
        distribute.have_dask = real


def _joint(path: Path) -> tuple[dict, dict]:
    """tp --json and analyze --json of the export that holds every rank."""
    doc = library.tp(path, cache=False)
    d = library.diagnosis(path, cache=False)
    from stepscope.pipeline import result_of
    from stepscope.render.json import analyze_document

    return doc, analyze_document(result_of(d, None))


def _comm_kernels_per_pid(path: Path) -> dict[int, int]:
    """An independent count: NCCL kernels per process, in plain SQL."""
    con = ro(path)
    try:
        return dict(con.execute(
            "SELECT (k.globalPid >> 24) & 16777215, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%' GROUP BY 1").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize("src", [TP2, TP2_GRAPH], ids=["eager", "graph"])
def test_ranks_split_into_reports_give_the_joint_exports_figures(src, tmp_path, monkeypatch):
    monkeypatch.setattr(distribute, "have_dask", lambda: False)
    before = sha256(src)
    reports = split.split_by_process(src, tmp_path)
    assert len(reports) == 2
    doc = run_dict(library.run(reports, cache=False))
    tp, analyzed = _joint(src)
    assert [r["rank"] for r in doc["run_ranks"]] == [r["rank"] for r in tp["ranks"]]
    counts = _comm_kernels_per_pid(src)
    for mine, theirs in zip(doc["run_ranks"], tp["ranks"]):
        assert (mine["pid"], mine["device"]) == (theirs["pid"], theirs["device"])
        assert len(mine["steps"]) == len(theirs["steps"])
        for a, b in zip(mine["steps"], theirs["steps"]):
            assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
            assert a["group"] == b["group"]
            joint_step = next(s for s in analyzed["steps"] if s["index"] == b["step"])
            assert a["predicted_graph_step_time_ns"] == joint_step["floors"]["predicted_graph_step_time_ns"]
        assert sum(s["collectives"] for s in mine["steps"]) <= counts[mine["pid"]]
        assert mine["collectives"] == sum(s["collectives"] for s in mine["steps"])
    assert doc["tp_steps"] == tp["tp_steps"]
    assert doc["rank_skew_ns"] == tp["rank_skew_ns"]
    assert sha256(src) == before


def test_the_eager_run_names_rank_1_binding_the_whole_run(tmp_path, monkeypatch):
    monkeypatch.setattr(distribute, "have_dask", lambda: False)
    doc = run_dict(library.run(split.split_by_process(TP2, tmp_path), cache=False))
    b = doc["binding_rank"]
    assert (b["rank"], b["tp_steps"], b["of"], b["share"]) == (1, 1, 1, 1.0)
    assert b["time_ns"] == doc["tp_steps"][0]["step_time_ns"] == max(
        s["step_time_ns"] for r in doc["run_ranks"] for s in r["steps"])
    r0, r1 = doc["run_ranks"]
    # the README's figures of this capture: rank 0 waits 13.80 ms, 0.46 ms of transfer per rank
    assert round(r0["collective_wait_ns"] / 1e6, 2) == 13.80
    assert r0["collective_transfer_ns"] == r1["collective_transfer_ns"]
    assert round(r0["collective_transfer_ns"] / 1e6, 2) == 0.46
    assert r0["collective_ns"] == r0["collective_transfer_ns"] + r0["collective_wait_ns"]
    assert (r0["binding_steps"], r1["binding_steps"]) == (0, 1)


def test_a_report_on_a_later_session_clock_lands_on_the_same_timeline(tmp_path, monkeypatch):
    monkeypatch.setattr(distribute, "have_dask", lambda: False)
    r0, r1 = split.split_by_process(TP2, tmp_path / "s")
    shifted = split.shift_clock(r1, tmp_path / "rank1_later.sqlite", 5_000_000_000)
    a = run_dict(library.run([r0, r1], cache=False))
    b = run_dict(library.run([r0, shifted], cache=False))
    assert [r["clock_offset_ns"] for r in b["reports"]] == [0, 5_000_000_000]
    assert b["run_ranks"] == a["run_ranks"] and b["tp_steps"] == a["tp_steps"]
    # without the session start the two clocks do not meet: nothing overlaps, nothing is split
    con = sqlite3.connect(shifted)
    con.execute("DROP TABLE TARGET_INFO_SESSION_START_TIME")
    con.commit()
    con.close()
    c = run_dict(library.run([r0, shifted], cache=False))
    assert c["warnings"] and "no session start" in c["warnings"][0]
    assert all(not s["split"] for r in c["run_ranks"] for s in r["steps"])
    assert c["binding_rank"] is None


def test_eight_reports_on_four_hosts(serial_doc, run_dir):
    doc = serial_doc
    assert doc["run"] == {"reports": 8, "ranks": 8, "hosts": ["node0", "node1", "node2", "node3"], "tp_steps": 1}
    # ranks by host, then device: node h's GPU d is rank 2h + d
    assert [(r["host"], r["device"]) for r in doc["run_ranks"]] == [(f"node{h}", d) for h in range(4) for d in (0, 1)]
    # identical copies: every collective of a rank overlaps its 7 counterparts exactly as in the
    # TP=2 export, so each rank's figures are its original rank's
    tp, _ = _joint(TP2)
    for r in doc["run_ranks"]:
        orig = tp["ranks"][r["device"]]["steps"][0]
        assert {k: r["steps"][0][k] for k in SAME} == {k: orig[k] for k in SAME}
    # ties between the four copies of rank 1 go to the lowest
    assert doc["binding_rank"]["rank"] == 1
    assert doc["tp_steps"][0]["ranks"] == 8


def test_a_dask_cluster_of_two_workers_gives_the_serial_result(serial_doc, run_dir):
    pytest.importorskip("distributed")
    doc = run_dict(library.run(run_dir, cache=False, workers=2, processes=False))
    assert doc == serial_doc


def test_without_dask_the_reports_run_one_after_another(run_dir, monkeypatch, capsys):
    from stepscope.render import progress

    notices = []
    monkeypatch.setattr(distribute, "have_dask", lambda: False)
    monkeypatch.setattr(progress, "notice", notices.append)
    distribute.map_reports(run_dir[:2], library.report_outcome, cache=False)
    assert notices and "one after another" in notices[0] and "stepscope[dask]" in notices[0]
    with pytest.raises(StepscopeError, match="--scheduler needs dask"):
        distribute.map_reports(run_dir[:2], library.report_outcome, scheduler="tcp://127.0.0.1:1")


def _damaged(run_dir, tmp_path) -> list[Path]:
    bad = tmp_path / "node9_truncated.sqlite"
    raw = run_dir[3].read_bytes()
    bad.write_bytes(raw[: len(raw) // 3])
    return [*run_dir[:3], bad, *run_dir[4:]]


def test_a_damaged_report_ends_in_one_line_naming_it(run_dir, tmp_path, monkeypatch):
    reports = _damaged(run_dir, tmp_path)
    before = sha256(reports[3])
    from stepscope.render import progress

    # one after another (as without dask: its notice, tested above, kept off stderr here), then
    # on a cluster of two workers (test_the_run_on_the_terminal runs the cluster of the default size)
    dask, notice = distribute.have_dask, progress.notice
    for serial, args in ((True, []), (False, ["--workers", "2"])):
        monkeypatch.setattr(distribute, "have_dask", (lambda: False) if serial else dask)
        monkeypatch.setattr(progress, "notice", (lambda _: None) if serial else notice)
        res = CliRunner().invoke(__import__("stepscope.cli", fromlist=["app"]).app,
                                 ["analyze", "--json", "--no-cache", *args, *map(str, reports)])
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "node9_truncated.sqlite" in lines[0], lines
    assert sha256(reports[3]) == before


def _dies_on_rank1_of_node1(path, step_regex=None, rules=None, cache=True, strict=False):
    from stepscope.library import report_outcome

    if "node1_" in path and "rank1" in path:
        os._exit(13)  # the worker process dies, as when the kernel kills it for memory
    return report_outcome(path, step_regex, rules, cache, strict)


def _hangs_on_node2(path, step_regex=None, rules=None, cache=True, strict=False):
    from stepscope.library import report_outcome

    if "node2_" in path:
        time.sleep(600)
    return report_outcome(path, step_regex, rules, cache, strict)


@pytest.mark.parametrize("fn, order, timeout, match", [
    (_dies_on_rank1_of_node1, range(8), 120, "node1_.*rank1.*worker analyzing it died"),
    # the hanging reports first, the healthy ones between: the run stops 3 s after the last
    # report that finished, naming the first still running, node2's rank 0 however long the
    # healthy reports take on a loaded box (a healthy report still running then is listed after
    # it; listed first, a healthy report slower than the limit was the one named)
    (_hangs_on_node2, (4, 0, 1, 5), 3, "node2_.*rank0.*not analyzed after 3 s")], ids=["dies", "hangs"])
def test_a_worker_that_dies_or_hangs_ends_in_one_line_naming_the_report(run_dir, fn, order, timeout, match):
    pytest.importorskip("distributed")
    import cloudpickle

    cloudpickle.register_pickle_by_value(__import__(__name__))  # the worker processes cannot import tests/
    t0 = time.monotonic()
    with pytest.raises(distribute.ReportError) as e:
        distribute.map_reports([run_dir[i] for i in order], fn, cache=False, workers=2, processes=True, timeout=timeout)
    assert re.search(match, str(e.value)), str(e.value)
    assert "\n" not in str(e.value)
    assert time.monotonic() - t0 < 120


def test_directories_globs_and_natural_order(run_dir, tmp_path):
    from stepscope.reports import expand_reports

    d = run_dir[0].parent
    assert expand_reports([d]) == sorted(d.glob("*.sqlite"), key=lambda p: p.name)
    for i in (10, 2, 1):
        (tmp_path / f"report_{i}.sqlite").write_bytes(b"")
    assert [p.name for p in expand_reports([str(tmp_path / "report_*.sqlite")])] == [
        "report_1.sqlite", "report_2.sqlite", "report_10.sqlite"]
    with pytest.raises(StepscopeError, match="given twice"):
        expand_reports([run_dir[0], run_dir[0]])
    with pytest.raises(StepscopeError, match="is a directory with no nsys SQLite export"):
        expand_reports([tmp_path / "empty"] if (tmp_path / "empty").mkdir() is None else [])
    with pytest.raises(StepscopeError, match="matches no file"):
        expand_reports([str(tmp_path / "nothing_*.sqlite")])


def test_one_path_keeps_todays_document(tmp_path):
    """A single report (a path, not a directory) is today's analyze: its document, not a run's."""
    from stepscope.cli import app

    res = CliRunner().invoke(app, ["analyze", "--json", "--no-cache", str(TP2)])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert "steps" in doc and "run_ranks" not in doc
    d = library.diagnosis(TP2, cache=False)
    from stepscope.pipeline import result_of
    from stepscope.render.json import analyze_json

    assert res.stdout == analyze_json(result_of(d, None)) + "\n"


def test_the_run_on_the_terminal(run_dir):
    from stepscope.cli import app

    res = CliRunner().invoke(app, ["analyze", "--no-cache", str(run_dir[0].parent)], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "run: 8 reports · 8 ranks on 4 hosts · 1 TP step" in out
    assert "rank 1 binds 1 of 1 TP step, 100% of the run's time" in out
    assert "13.800" in out  # rank 0's wait, in ms


def test_a_serving_report_keeps_its_queued_replays_in_the_run_view():
    """A vLLM serving export as a run of one report: its steps' what-if is analyze's, queued
    replays included (async, vLLM's default); the same report marked sync (a sidecar saying
    sync_scheduling) is not queued, and its queued decodes come out longer."""
    from dataclasses import replace

    import polars as pl

    from stepscope.analysis.reports_run import combine
    from stepscope.library import report_result
    from tests.conftest import serving_diagnosis, serving_export

    path = serving_export("eager")
    r = report_result(path, cache=False)
    assert r.scheduling == "async"
    d = serving_diagnosis("eager")  # library.diagnosis(path, cache=False), shared with the serving tests
    want = d.graph_prediction.select("step", "predicted_graph_step_time_ns", "predicted_graph_queued")
    got = combine([r]).steps.select("step", "predicted_graph_step_time_ns")
    both = want.join(got, on="step", suffix="_run")
    assert both.height == d.inv.steps.height
    assert (both["predicted_graph_step_time_ns"] == both["predicted_graph_step_time_ns_run"]).all()
    sync = combine([replace(r, scheduling="sync")]).steps.select("step", "predicted_graph_step_time_ns")
    q = both.join(sync, on="step", suffix="_sync").filter(pl.col("predicted_graph_queued"))
    assert q.height > 50 and (q["predicted_graph_step_time_ns_sync"] > q["predicted_graph_step_time_ns"]).all()


def test_the_terminals_rank_rows_are_the_medians_of_each_ranks_steps(tmp_path, monkeypatch):
    """The run's terminal rows (analysis/reports_run.rank_medians, formatted by render_run) are
    the medians of each rank's own steps in the JSON document, and its most frequent verdict:
    counted here with the standard library, not polars."""
    import statistics
    from collections import Counter

    from rich.console import Console

    from stepscope.render.reports_run import render_run
    from stepscope.render.units import ms_num

    monkeypatch.setattr(distribute, "have_dask", lambda: False)
    # two hosts' copies of a three-step capture: two ranks of three steps each
    view = library.run(split.run_of(FIXTURES / "round5" / "llama1b_decode_3steps_nonvtx.sqlite", tmp_path, hosts=2),
                       cache=False)
    doc = run_dict(view)
    rows = {r["rank"]: r for r in view.medians.to_dicts()}
    assert sorted(rows) == [r["rank"] for r in doc["run_ranks"]]
    for r in doc["run_ranks"]:
        steps = r["steps"]
        assert len(steps) == r["n_steps"] > 1
        for c in ("step_time_ns", "collective_ns", "cpu_floor_ns", "device_floor_ns"):
            assert rows[r["rank"]][c] == statistics.median(s[c] for s in steps), c
        counts = Counter(s["verdict"] for s in steps)
        top = max(counts.values())
        assert rows[r["rank"]]["verdict"] == min(v for v, n in counts.items() if n == top)
    console = Console(width=200, record=True, color_system=None)
    render_run(view, console)
    text = console.export_text()
    for r in doc["run_ranks"]:
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{r['rank']} ") and "%)" in x)
        assert ms_num(statistics.median(s["step_time_ns"] for s in r["steps"])) in line
