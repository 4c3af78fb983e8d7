"""Serving runs (issue 33): the real 48-request vLLM run captured on the H200 in graph and eager
mode (fixtures/serving/, fixtures/README.md "Seventh device round"). Steps, kernels per step and
composition are checked against plain SQL over the export; untraced figures against the sidecar;
the run view against its own definition (its parts add up to the run)."""

from __future__ import annotations

import json
import re
import sqlite3

import polars as pl
import pytest

from conftest import serving_diagnosis, serving_export
from stepscope import library
from stepscope.analysis.diagnosis import diagnose
from stepscope.analysis.run import run_view
from stepscope.analysis.notes import EMPTY_STEP_RANGES

MODES = ("graph", "eager")
STEP_NAME = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def export(mode: str):
    return serving_export(mode)


def diag(mode: str):
    return serving_diagnosis(mode)


def sql_steps(path) -> list[dict]:
    """The execute_context ranges and the kernels whose launching call starts between a range's
    start and the next range's start on the same thread (plain SQL; the last range takes the
    rest of the thread's launches)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("""
        WITH r AS (
          SELECT n.start, n.globalTid AS tid, coalesce(n.text, s.value) AS name
          FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
          WHERE coalesce(n.text, s.value) LIKE 'execute_context%'),
        w AS (SELECT start, tid, name, lead(start) OVER (PARTITION BY tid ORDER BY start) AS nxt FROM r)
        SELECT w.name, w.start,
          (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME a JOIN CUPTI_ACTIVITY_KIND_KERNEL k
             ON k.correlationId = a.correlationId AND k.globalPid = (a.globalTid / 16777216) * 16777216
           WHERE a.globalTid = w.tid AND a.start >= w.start AND (w.nxt IS NULL OR a.start < w.nxt)) AS kernels
        FROM w ORDER BY w.start""").fetchall()
    con.close()
    return [{"name": n, "start": s, "kernels": k} for n, s, k in rows]


@pytest.mark.parametrize("mode", MODES)
def test_steps_and_kernels_per_step_equal_plain_sql(mode):
    d = diag(mode)
    want = [r for r in sql_steps(export(mode)) if r["kernels"]]  # ranges that launched GPU work
    s = d.inv.steps.sort("step_begin")
    assert s.height == len(want) == 132
    assert s["n_kernels"].to_list() == [r["kernels"] for r in want]
    assert s["name"].to_list() == [r["name"] for r in want]
    # the ranges without GPU work, as the analysis' note (its count: SQL's) and as the document words it
    empty = [w for w in d.inv.warnings if getattr(w, "code", None) == EMPTY_STEP_RANGES]
    assert [w["count"] for w in empty] == [len(sql_steps(export(mode))) - len(want)]
    from stepscope.render.sentences import warning_texts

    assert f"{empty[0]['count']} step range(s) launched no GPU work and were skipped" in warning_texts(d.inv.warnings)


@pytest.mark.parametrize("mode", MODES)
def test_composition_and_phase_from_the_range_names(mode):
    s = diag(mode).inv.steps.sort("step_begin")
    for r in s.iter_rows(named=True):
        pr, pt, dr, dt = map(int, STEP_NAME.search(r["name"]).groups())
        assert (r["prompt_reqs"], r["prompt_tokens"], r["decode_reqs"], r["decode_tokens"]) == (pr, pt, dr, dt)
        assert r["phase"] == ("mixed" if pr and dr else "prefill" if pr else "decode")
    assert (s["phase"] == "mixed").sum() == 40
    # a mixed step's attention kernel is classed as prefill attention
    mixed = s.filter(pl.col("phase") == "mixed")["step"]
    c = diag(mode).inv.classes.filter(pl.col("step").is_in(mixed.to_list()))
    assert "attention_decode" not in c["class"].cast(pl.String).to_list()


def test_graph_mode_per_step_from_its_graph_launches():
    con = sqlite3.connect(f"file:{export('graph')}?mode=ro", uri=True)
    launches = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME a JOIN StringIds s ON s.id = a.nameId
                              WHERE s.value LIKE 'cudaGraphLaunch%'""").fetchone()[0]
    con.close()
    s = diag("graph").inv.steps
    assert s["n_graph_launches"].sum() == launches
    # vLLM replays a full graph for decode batches it captured; mixed steps of ~2,048 tokens
    # are beyond its largest capture size and run without one
    assert set(s.filter(pl.col("phase") == "decode")["graph_mode"]) == {"full"}
    assert set(s.filter(pl.col("phase") == "mixed")["graph_mode"]) == {"eager"}
    assert set(diag("eager").inv.steps["graph_mode"]) == {"eager"}


@pytest.mark.parametrize("mode", MODES)
def test_untraced_steps_are_the_sidecars_same_steps(mode):
    d = diag(mode)
    side = json.loads((export(mode).parent / f"llama-3.1-8b_serve_r48_s0_{mode}.stepscope.json").read_text())
    rows = [r for r in side["untraced"]["per_step"] if r["tokens"]]
    s = d.inv.steps.sort("step_begin").join(d.untraced, on="step")
    matched = 0
    for k, r in enumerate(s.iter_rows(named=True)):
        sc = rows[k]
        same = (sc["ctx_reqs"], sc["ctx_tokens"], sc["gen_reqs"], sc["gen_tokens"]) == (
            r["prompt_reqs"], r["prompt_tokens"], r["decode_reqs"], r["decode_tokens"])
        if same:
            matched += 1
            assert r["untraced_source"] == "measured" and r["untraced_measured_ns"] == sc["step_time_ns"]
        # an estimate never exceeds the traced step
        assert r["untraced_estimated_ns"] <= r["step_time_ns"]
    assert matched >= 90  # the rest differ by a step or two where the two runs diverged


@pytest.mark.parametrize("mode", MODES)
def test_the_run_view_adds_up(mode):
    d = diag(mode)
    v = run_view(d)
    s = d.inv.steps
    assert v["steps"] == s.height == sum(k["count"] for k in v["kinds"])
    assert v["steps_time_ns"] == s["step_time_ns"].sum() == sum(k["time_ns"] for k in v["kinds"])
    assert v["wall_ns"] == s["step_end"].max() - s["step_begin"].min()
    assert abs(sum(k["share"] for k in v["kinds"]) - 1) < 1e-9
    t = v["time"]
    parts = (t["gpu_busy_ns"] + t["idle_host_bound_ns"] + t["idle_sync_ns"] + t["idle_device_side_ns"]
             + t["idle_host_pause_ns"] + t["host_prep_ns"] + t["host_after_ns"] + t["between_steps_ns"])
    assert parts - t["overlap_ns"] == v["wall_ns"]
    assert 0 <= t["overlap_ns"] < 0.01 * v["wall_ns"]
    times = sorted(s["step_time_ns"].to_list(), reverse=True)
    assert [r["step_time_ns"] for r in v["slowest"]] == times[:5]
    assert v["throughput"]["tokens"] == int((s["prompt_tokens"] + s["decode_tokens"]).sum())
    assert sum(v["verdicts"].values()) == s.height
    # the most frequent verdict first, ties by name: the document's bytes do not follow threads
    assert list(v["verdicts"].items()) == sorted(v["verdicts"].items(), key=lambda kv: (-kv[1], kv[0]))


def test_launch_latency_is_launching_and_queueing_its_own_figure():
    d = diag("graph")
    decode = d.inv.steps.filter(pl.col("phase") == "decode")["step"].to_list()
    lau = d.launch.filter(pl.col("step").is_in(decode))
    # async scheduling queues a step's kernels behind the previous step's: milliseconds of it,
    # while launching itself takes microseconds
    assert lau["latency_median_ns"].median() < 10_000
    assert lau["queued_behind_p90_ns"].median() > 1_000_000


def test_analyze_opens_with_the_run_and_json_has_it():
    from conftest import CliRunner
    from stepscope.cli import app

    r = CliRunner().invoke(app, ["analyze", str(export("graph")), "--no-cache"], env={"COLUMNS": "80"})
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert any(line.startswith("132 steps in") for line in lines[:12])
    assert "steps by kind" in r.output and "slowest steps" in r.output
    assert "--kinds shows each" in r.output
    j = CliRunner().invoke(app, ["analyze", str(export("graph")), "--json", "--no-cache"])
    doc = json.loads(j.stdout)
    assert doc["run"]["steps"] == 132 and len(doc["steps"]) == 132
    assert doc["run"]["kinds"][0]["kind"] == "mixed · eager · 17–32 reqs"


def test_reports_open_with_the_run_and_chart_every_step(tmp_path):
    html = library.report(export("graph"), tmp_path / "r.html").content
    assert html.index('id="run"') < html.index("<h2>Summary</h2>")
    chart = html[html.index('id="run-chart"'):]
    chart = chart[: chart.index("</svg>")]
    assert chart.count("<circle") == 132
    assert "132 steps in 2.445 s" in html
    md = library.report(export("graph"), tmp_path / "r.md").content
    assert md.index("### The run") < md.index("| kind | steps |")
    assert "| mixed · eager · 17–32 reqs | 30 |" in md


def test_a_single_step_trace_has_no_run_view():
    from conftest import FIXTURES

    d = diagnose(library.load(FIXTURES / "llama8b_decode_b1_eager.sqlite", None, None, cache=False))
    assert run_view(d) is None


def test_a_step_regex_that_matches_nothing_warns_or_fails_with_strict():
    from conftest import CliRunner
    from stepscope.cli import app

    args = ["analyze", str(export("graph")), "--no-cache", "--step-regex", "^no such range$"]
    warned = CliRunner().invoke(app, args + ["--json"])
    assert warned.exit_code == 0
    assert any("matched no NVTX range" in w for w in json.loads(warned.stdout)["warnings"])
    failed = CliRunner().invoke(app, args + ["--strict"])
    assert failed.exit_code == 2 and "(--strict)" in failed.stderr and "Traceback" not in failed.output
    # --strict holds for its own command line only
    again = CliRunner().invoke(app, args + ["--json"])
    assert again.exit_code == 0
