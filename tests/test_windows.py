"""A long trace analyzed by windows of steps (analysis/windows.py, by_windows.py): the same
document as the trace analyzed whole, down to the byte, with windows as small as one step (every
step then straddles a window's edge: its context, the steps before and after it, lies in the
windows beside it); every step range owned by exactly one window (plain SQL's count); a trace
unfit for windows analyzed whole, and the reason said."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FIXTURES, SERVING, examples, gunzipped, ro
from stepscope import library
from stepscope.analysis import windows
from stepscope.analysis.memory import ONE_SHOT
from stepscope.pipeline import Options
from stepscope.render.json import analyze_json
from tests.test_mutated_captures import _mutated, mutations

# the captures whose steps are vLLM's NVTX step ranges: a serving run eager and with CUDA graphs,
# the eager MoE serving capture, and both TP=2 captures (two processes, one GPU each)
RUNS = [SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz", SERVING / "llama-3.1-8b_serve_r48_s0_graph.sqlite.gz",
        FIXTURES / "models" / "qwen3-30b-a3b_serve_r16_s0_eager.sqlite.gz",
        FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite", FIXTURES / "llama8b_decode_b1_graph_tp2.sqlite"]
# plain captures (no step range, no capture range) whose steps are vLLM's engine iterations, cut
# along its `schedule: …` ranges (VLLM_NVTX_SCOPES_FOR_PROFILING=1; ~11 of them an iteration): a
# whole serving run with its start-up, and the MLA MoE model's (DeepSeek-V2-Lite)
SCHEDULED = [SERVING / "llama1b_serve_r16_graph_plain_scopes.sqlite.gz",
             FIXTURES / "models" / "deepseek-v2-lite_r32_graph_plain.sqlite.gz"]
# plain captures without any range, whose steps are vLLM's engine loop's (its input preparation's
# kernels): found once from a light read of the run, each window given those that meet it
ENGINE = [SERVING / "llama1b_serve_r16_graph_plain_bare.sqlite.gz",
          FIXTURES / "vllm_serve" / "llama-3.1-8b_serve_flush.sqlite.gz"]
# a capture with neither ranges nor vLLM's engine loop (a torch loop's capture range of 3 steps)
NO_RANGE = FIXTURES / "round5" / "llama1b_decode_3steps_nonvtx.sqlite"


def _path(p):
    return gunzipped(p) if p.name.endswith(".gz") else p


def _document(path, window_steps: int) -> str:
    r = library.analyze(path, Options(memory=ONE_SHOT, window_steps=window_steps), cache=False, events=False)
    return analyze_json(r)


def _by_windows(monkeypatch, path, window_steps: int) -> str:
    """_document by windows, and analyzed by windows indeed (not whole after a window found
    them unfit)."""
    from stepscope import by_windows

    merged = []
    real = by_windows.diagnosis
    monkeypatch.setattr(by_windows, "diagnosis", lambda *a, **k: merged.append(real(*a, **k)) or merged[-1])
    got = _document(path, window_steps)
    assert len(merged) == 1 and merged[0] is not None
    return got


_WHOLE: dict = {}


def _whole(path) -> str:
    if path not in _WHOLE:
        _WHOLE[path] = _document(path, 0)
    return _WHOLE[path]


# the step ranges, counted in SQL: vLLM's and `step …` names (DEFAULT_STEP_REGEX's branches these
# captures use; none of them nests one in another)
RANGES_SQL = ("SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
              "WHERE (coalesce(e.text, s.value) GLOB 'execute_*context_*_generation_*' "
              "OR coalesce(e.text, s.value) GLOB 'step *' OR coalesce(e.text, s.value) = 'step') AND e.end IS NOT NULL")


# vLLM's scheduler ranges, counted in SQL
SCHEDULE_SQL = ("SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                "WHERE coalesce(e.text, s.value) GLOB 'schedule: *' AND e.end IS NOT NULL")


# (a window of one scheduler range is ~1,200 windows of the MLA capture, two minutes on the box:
# its windows of 7 ranges only)
CASES = [(p, n) for p in RUNS + SCHEDULED[:1] for n in (1, 7)] + [(SCHEDULED[1], 7)]


@pytest.mark.parametrize("source,window_steps", CASES, ids=[f"{n}-{p.name}" for p, n in CASES])
def test_windows_give_the_whole_documents_bytes(source, window_steps, monkeypatch):
    path = _path(source)
    with ro(path) as con:
        ranges = con.execute(SCHEDULE_SQL if source in SCHEDULED else RANGES_SQL).fetchone()[0]
    from stepscope.ingest import read_trace

    p = windows.plan(read_trace(path, cache=False).nvtx, None, window_steps)
    if ranges <= window_steps:
        assert p.windows == () and p.why_whole
        return
    # every range is owned by one window: the windows' own spans tile the time axis
    assert len(p.windows) == -(-ranges // window_steps)
    assert p.windows[0].own_lo is None and p.windows[-1].own_hi is None
    assert all(a.own_hi == b.own_lo for a, b in zip(p.windows, p.windows[1:]))
    # a window's events end a few ranges past its own ones: bounded, not the rest of the trace
    if len(p.windows) > 3:
        assert p.windows[0].hi is not None and p.windows[1].hi is not None
    got = _by_windows(monkeypatch, path, window_steps)
    assert got == _whole(path)
    # and the steps are the trace's, not the windows': as many as plain SQL's ranges that
    # launched GPU work, numbered 0..n-1 in start order
    doc = json.loads(got)
    assert [s["index"] for s in doc["steps"]] == list(range(len(doc["steps"])))
    assert len(doc["steps"]) <= ranges


# the engine loop's input preparation, launched once per iteration (and by the start-up's runs):
# its launches after the last graph capture, counted in SQL
ANCHORS_SQL = """
WITH cap AS (SELECT max(r.end) AS e FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId
             WHERE n.value GLOB 'cudaStreamEndCapture*')
SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24
WHERE s.value = '_prepare_pos_seq_lens_kernel' AND r.start > coalesce((SELECT e FROM cap), 0)
"""


def _stripped(tmp_path, source):
    """A copy of `source` without any NVTX range (steps without names: the engine loop's)."""
    import shutil
    import sqlite3

    path = tmp_path / f"stripped-{source.name.removesuffix('.gz')}"
    shutil.copy(_path(source), path)
    con = sqlite3.connect(path)
    con.execute("DELETE FROM NVTX_EVENTS")
    con.commit()
    con.close()
    return path


ENGINE_CASES = [(ENGINE[0], 1), (ENGINE[0], 7), (ENGINE[1], 5), (SCHEDULED[1], 7)]


@pytest.mark.parametrize("source,window_steps", ENGINE_CASES,
                         ids=[f"{n}-{p.name}" for p, n in ENGINE_CASES])
def test_engine_loop_steps_by_windows_give_the_whole_documents_bytes(source, window_steps, monkeypatch, tmp_path):
    """A plain capture without any range (and the MLA MoE capture with its ranges deleted): the
    engine loop's steps are found once from a light read of the run (its calls, its marking
    kernels and copies, a warm-up run's kernels), each owned by one window (by its start), each
    window given those that meet its host time; the document is the whole trace's, byte for byte."""
    path = _stripped(tmp_path, source) if source in SCHEDULED else _path(source)
    with ro(path) as con:
        anchors = con.execute(ANCHORS_SQL).fetchone()[0]
    engine, kept = _light_engine_steps(path)
    # the steps of the whole trace's engine loop, from a few of its calls
    assert engine.equals(_whole_engine_steps(path))
    assert 0 < kept < _calls(path) / 2
    # one step per iteration of the loop after the start-up's capture, less its warm-up runs
    assert engine["delimiter"].unique().to_list() == ["engine"]
    assert anchors - 3 <= engine.height <= anchors and engine.height > 50
    assert engine["name"].to_list() == [f"engine step #{i + 1}" for i in range(engine.height)]
    p = windows.plan(pl.DataFrame(), None, window_steps, windows.engine_ranges(engine), engine)
    assert len(p.windows) == -(-engine.height // window_steps)
    assert all(a.own_hi == b.own_lo for a, b in zip(p.windows, p.windows[1:]))
    owned = [sum(1 for s in engine["w_start"] if (w.own_lo is None or s >= w.own_lo)
                 and (w.own_hi is None or s < w.own_hi)) for w in p.windows]
    assert owned == [n for w in p.windows for _, n in w.ranges] and sum(owned) == engine.height
    # each window holds the steps that meet its host time, its own ones among them
    for w in p.windows:
        starts = {r[2] for r in w.engine}
        assert {s for s in engine["w_start"] if (w.own_lo is None or s >= w.own_lo)
                and (w.own_hi is None or s < w.own_hi)} <= starts
    got = _by_windows(monkeypatch, path, window_steps)
    assert got == _whole(path)
    assert len(json.loads(got)["steps"]) == engine.height


def _light_engine_steps(path):
    """by_windows' engine steps of `path` and how many calls its light read kept (its last read)."""
    from stepscope import by_windows

    reader = by_windows._Reader(path)
    kept = []
    scan = reader.reader.scan_calls
    reader.reader.scan_calls = lambda keep: kept.append(scan(keep)) or kept[-1]
    try:
        return reader.engine_steps(), kept[-1].height
    finally:
        reader.close()


def _whole_engine_steps(path):
    from stepscope.analysis.steps import engine_windows, trace_api_flags
    from stepscope.ingest import read_trace

    t = read_trace(path, cache=False)
    pids = set(t.kernels["pid"].unique().to_list()) | set(t.memops["pid"].unique().to_list())
    return engine_windows(t, trace_api_flags(t), pids)


def _calls(path) -> int:
    with ro(path) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]


def test_warm_up_runs_past_the_light_reads_iterations_read_every_call(monkeypatch):
    """The light read holds the leading iterations whole for the start-up's warm-up runs (two in
    these captures); where they reach past them (here: one iteration held), the run's calls are
    read again, every one: the same steps as the whole trace's."""
    from stepscope.analysis import engine_calls

    path = _path(ENGINE[0])
    monkeypatch.setattr(engine_calls, "LEAD_ITERATIONS", 1)
    engine, kept = _light_engine_steps(path)
    assert engine.equals(_whole_engine_steps(path))
    with ro(path) as con:  # every call of the kept names (the whole read's filter)
        assert kept >= con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                                   "ON s.id = r.nameId WHERE s.value GLOB 'cu*Launch*'").fetchone()[0]


def test_a_window_of_one_step_holds_its_neighbours():
    """With one step a window, each window's events reach one step range before its own and two
    after: the context that a step's begin (the previous step's GPU end) and a vLLM step's end
    (the next iteration's range) are read from."""
    from stepscope.ingest import read_trace

    t = read_trace(_path(RUNS[0]), cache=False)
    p = windows.plan(t.nvtx, None, 1)
    starts = sorted(windows.step_ranges(t.nvtx, None)["w_start"].to_list())
    mid = p.windows[5]
    i = starts.index(mid.own_lo)
    assert (mid.lo, mid.own_hi, mid.hi) == (starts[i - 1], starts[i + 1], starts[i + 3])
    sub = windows.window_trace(t, mid)
    # every API call of the window started inside it, every kernel it holds was launched by one
    # of them or started inside it
    assert sub.api["start"].min() >= mid.lo and sub.api["start"].max() < mid.hi
    assert sub.kernels.height < t.kernels.height


def test_an_engine_iteration_past_its_window_is_read_further():
    """A plain capture's windows are cut along vLLM's `schedule: …` ranges, ~11 to an engine
    iteration (the plan reaches two iterations' worth past a window's own ranges, by its rarest
    range name's count). Cut to two ranges after, a window's context rarely reaches the next
    iteration's start (where its last own iteration ends): such a window is read again to its
    next end, its rows not counted twice; the iterations it owns are those whose first range
    starts in its own span (plain SQL's count below), each owned by one window, and named by
    its place on its thread in the trace."""
    from dataclasses import replace

    from stepscope.analysis.classify import load_rules
    from stepscope.ingest import read_trace

    path = _path(SCHEDULED[0])
    t = read_trace(path, cache=False)
    p = windows.plan(t.nvtx, None, 1)
    assert {d for _, d in p.windows[0].kinds} == {"schedule"}
    starts = windows.step_ranges(t.nvtx, None)["w_start"].sort()
    with ro(path) as con:  # ranges per schedule() call, as the plan estimates them
        calls, ranges = con.execute(CALLS_SQL).fetchone()
    assert p.windows[3].hi == starts[starts.search_sorted(p.windows[3].own_hi, "left") + 2 * -(-ranges // calls)]
    # every window cut to two ranges after its own ones, its plan's ends the further ones
    cut = []
    for w in p.windows:
        if w.hi is None:
            cut.append(w)
            continue
        j = starts.search_sorted(w.own_hi, "left") + 2
        cut.append(replace(w, hi=int(starts[j]), wider=(w.hi, *w.wider)))
    reads, results = [], []

    def read(w, count):
        reads.append((w.index, w.hi, count))
        return windows.window_trace(t, w)

    rules = load_rules(None)
    for w in cut:
        results.append(windows.analyze_read(read, w, None, rules))
    again = [(i, hi) for i, hi, count in reads if not count]
    assert again and all(count for i, hi, count in reads if (i, hi) not in again)
    for i, hi in again:  # a read again reaches one of the window's further ends, in turn
        w = cut[i]
        assert hi in w.wider and hi != w.hi
    assert len(reads) == len(cut) + len(again)
    # SQL: the schedule() calls (each ends with `schedule: update_after_schedule`) that launched
    # work before the next one began: an iteration each
    with ro(path) as con:
        launched = con.execute(ITERATIONS_SQL).fetchone()[0]
    assert sum(r.steps for r in results) == launched == 99
    # each numbered by one window: its place among the window's own iterations on its thread
    # (those that launched nothing counted in, as the whole trace numbers them)
    owned = pl.concat([r.iterations for r in results if r.iterations is not None])
    assert owned.height == launched
    assert sum(n for r in results for *_, n in r.iteration_counts) >= launched


# the schedule() calls (the rarest of the scheduler range names: `allocate_slots` is once per request)
# and the scheduler ranges
CALLS_SQL = """
WITH r AS (SELECT coalesce(e.text, s.value) AS name FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
           WHERE coalesce(e.text, s.value) GLOB 'schedule: *' AND e.end IS NOT NULL)
SELECT (SELECT min(n) FROM (SELECT count(*) AS n FROM r GROUP BY name)), (SELECT count(*) FROM r)
"""


# the schedule() calls whose work a launch call of the process began before the next call's
# first range; runtime call names as nsys records them
ITERATIONS_SQL = """
WITH r AS (SELECT e.start, e.end, (e.globalTid >> 24) & 16777215 AS pid, coalesce(e.text, s.value) AS name
           FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
           WHERE coalesce(e.text, s.value) GLOB 'schedule: *' AND e.end IS NOT NULL),
     u AS (SELECT r.pid, r.end, (SELECT min(n.start) FROM r n WHERE n.pid = r.pid AND n.start > r.end) AS nxt
           FROM r WHERE r.name GLOB 'schedule: update_after_schedule*')
SELECT count(*) FROM u WHERE EXISTS (
    SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME c JOIN StringIds n ON n.id = c.nameId
    WHERE (c.globalTid >> 24) & 16777215 = u.pid AND c.start > u.end AND c.start < coalesce(u.nxt, 1 << 62)
      AND (n.value GLOB 'cudaLaunchKernel*' OR n.value GLOB 'cudaGraphLaunch*' OR n.value GLOB 'cuLaunchKernel*'))
"""


@pytest.mark.parametrize("name", ["llama8b_decode_b1_eager.sqlite", "round5/llama1b_decode_3steps_nonvtx.sqlite"])
def test_a_trace_unfit_for_windows_is_analyzed_whole(name):
    """One step range (nothing to cut), or no range to cut along at all (a capture range's steps,
    found from the whole trace's kernels): plan says why, and the document is the whole one."""
    from stepscope.ingest import read_trace

    path = _path(FIXTURES / name)
    p = windows.plan(read_trace(path, cache=False).nvtx, None, 1)
    assert p.windows == ()
    assert p.why_whole in ("one window holds every step", windows.NO_RANGES)
    assert _document(path, 1) == _whole(path)


def test_a_long_run_read_whole_says_why_and_what_capture_has_ranges():
    """Windows asked of a capture with neither ranges nor vLLM's engine loop: the document is the
    whole one, and one line on stderr says it was read whole (its kernel count, as SQL counts it),
    why, and the capture that a long run can be cut along."""
    from conftest import CliRunner
    from stepscope.cli import app

    path = NO_RANGE
    n = ro(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    runner = CliRunner()
    whole = runner.invoke(app, ["analyze", str(path), "--json", "--no-cache", "--window-steps", "0"])
    asked = runner.invoke(app, ["analyze", str(path), "--json", "--no-cache", "--window-steps", "3"])
    assert whole.exit_code == asked.exit_code == 0
    assert asked.stdout == whole.stdout
    assert "read whole" not in whole.stderr
    said = [line for line in asked.stderr.splitlines() if "read whole" in line]
    assert len(said) == 1
    assert f"its {n:,} kernels are read whole" in said[0]
    assert windows.NO_RANGES in said[0] and "VLLM_NVTX_SCOPES_FOR_PROFILING=1" in said[0]


def test_the_window_size_follows_the_export():
    from stepscope.by_windows import WINDOW_KERNELS, WINDOW_MIN_KERNELS, window_steps_for

    assert window_steps_for(WINDOW_MIN_KERNELS, 5000, None) == 0  # small enough to read whole
    assert window_steps_for(25_000_000, 58_000, None) == WINDOW_KERNELS // (25_000_000 // 58_000)
    assert window_steps_for(25_000_000, 58_000, 3) == 3
    assert window_steps_for(25_000_000, 58_000, 0) == 0


def test_the_cli_window_option_writes_the_same_bytes():
    from conftest import CliRunner
    from stepscope.cli import app

    path = str(_path(RUNS[0]))
    runner = CliRunner()
    whole = runner.invoke(app, ["analyze", path, "--json", "--no-cache", "--window-steps", "0"])
    by_windows = runner.invoke(app, ["analyze", path, "--json", "--no-cache", "--window-steps", "9"])
    assert whole.exit_code == by_windows.exit_code == 0
    assert by_windows.stdout == whole.stdout
    bad = runner.invoke(app, ["analyze", path, "--json", "--window-steps", "-1"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


@pytest.mark.parametrize("source", [RUNS[1], RUNS[3]], ids=[RUNS[1].name, RUNS[3].name])
def test_the_terminal_says_the_same_by_windows(source):
    """The run view, each kind's verdict and diagnosis (--kinds), the trace's kernel count: the
    same text from the windows' frames as from the whole trace's."""
    from conftest import CliRunner
    from stepscope.cli import app

    path = str(_path(source))
    runner = CliRunner()
    whole = runner.invoke(app, ["analyze", path, "--kinds", "--no-cache", "--window-steps", "0"])
    by_windows = runner.invoke(app, ["analyze", path, "--kinds", "--no-cache", "--window-steps", "1"])
    assert whole.exit_code == by_windows.exit_code == 0
    assert by_windows.stdout == whole.stdout


def test_a_run_analyzed_by_windows_is_kept_and_read_back(tmp_path):
    """The merged analysis is kept in the export's cache folder (a frameless entry: the frames of
    a long run are never cached) and the next run reads it: the same document and terminal, the
    export untouched; --no-cache neither reads nor writes it."""
    import shutil

    from conftest import CliRunner, sha256
    from stepscope.cli import app

    path = tmp_path / "run.sqlite"
    shutil.copy(_path(RUNS[0]), path)
    before = sha256(path)
    runner = CliRunner()
    first = runner.invoke(app, ["analyze", str(path), "--json", "--window-steps", "9"])
    entries = sorted((tmp_path / ".stepscope-cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "meta.json").is_file()
    assert [d.name.split("-")[0] for d in entries[0].iterdir() if d.is_dir()] == ["windows"]
    again = runner.invoke(app, ["analyze", str(path), "--json", "--window-steps", "9"])
    assert first.exit_code == again.exit_code == 0
    whole = runner.invoke(app, ["analyze", str(path), "--json", "--no-cache", "--window-steps", "0"])
    assert first.stdout == again.stdout == whole.stdout
    terminal = runner.invoke(app, ["analyze", str(path), "--kinds", "--window-steps", "9"])
    fresh = runner.invoke(app, ["analyze", str(path), "--kinds", "--no-cache", "--window-steps", "0"])
    assert terminal.stdout == fresh.stdout
    assert sha256(path) == before


def test_windows_on_a_local_dask_cluster_give_the_same_document():
    """--workers 2: each window read and analyzed on a worker (the reader sent once to each),
    merged here: the bytes of the serial run's document, the readings' accounts added up."""
    path = _path(RUNS[2])
    r = library.analyze(path, Options(memory=ONE_SHOT, window_steps=7), cache=False, events=False, workers=2)
    assert analyze_json(r) == _whole(path)


def test_a_bad_scheduler_for_one_long_report_is_one_line():
    from conftest import CliRunner
    from stepscope.cli import app

    r = CliRunner().invoke(app, ["analyze", str(_path(RUNS[0])), "--scheduler", "local", "--window-steps", "9"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--scheduler 'local'" in r.output and "tcp://" in r.output and "--workers N" in r.output
    assert len(r.output.strip().splitlines()) == 1


# The serving captures whose steps are vLLM's NVTX ranges or its engine iterations, mutated the way
# real captures go wrong (tests/test_mutated_captures.py's mutations: rows lost, the trace cut, NVTX
# lost, names garbled, rows twice, a clock shifted): by windows of any size, the whole analysis'
# document or its one line.
MUTABLE = [RUNS[0], RUNS[2], SCHEDULED[0], ENGINE[0]]


def _analyze_line(path, window_steps: int):
    from stepscope.errors import InputError

    try:
        return _document(path, window_steps)
    except InputError as e:
        return f"error: {e}"


@pytest.mark.parametrize("ops,window_steps", [
    # found by the property below: a GPU clock 1000 s off is refused by the whole capture's count
    # of its kernels, not by the first window's
    ([("lose", "CUPTI_ACTIVITY_KIND_KERNEL", 12, 73), ("no_nvtx", "rows", 26, 88),
      ("shift", "CUPTI_ACTIVITY_KIND_KERNEL", 1_000_000_000_000)], 1)])
def test_windows_on_a_capture_the_whole_refuses(tmp_path, ops, window_steps):
    path = _mutated(tmp_path, _path(RUNS[0]), ops)
    line = _analyze_line(path, 0)
    assert line.startswith("error: ") and "47,911 of its 47,911 kernels" in line
    assert _analyze_line(path, window_steps) == line


@examples(full=6, quick=2)
@given(source=st.sampled_from(MUTABLE), ops=mutations, window_steps=st.integers(1, 30))
def test_windows_hold_on_mutated_captures(source, ops, window_steps):
    import tempfile
    from pathlib import Path

    # a scheduled capture's windows count scheduler ranges, ~11 to an iteration: as many steps a window
    n = window_steps * (11 if source in SCHEDULED else 1)
    with tempfile.TemporaryDirectory() as d:
        path = _mutated(Path(d), _path(source), ops)
        assert _analyze_line(path, n) == _analyze_line(path, 0)


def test_a_progress_bar_counts_the_windows_on_a_terminal_only():
    """On a terminal the windows are counted as they are analyzed (a bar, `done/total`); a --json
    document going to a pipe draws nothing."""
    from tests.test_cli import on_a_terminal

    path = _path(RUNS[0])
    rc, out, tty = on_a_terminal("analyze", path, "--no-cache", "--window-steps", "30")
    assert rc == 0 and "the run" in out
    # ceil(134 step ranges / 30) windows
    assert f"0/5 windows of {path.name} analyzed (30 ranges each)" in tty and "5/5 windows of" in tty
    # (one step's document: on_a_terminal reads stdout once the command ends, a pipe holds 64 KiB)
    rc, out, tty = on_a_terminal("analyze", path, "--no-cache", "--window-steps", "30", "--json", "--steps", "0")
    assert rc == 0 and json.loads(out)["steps"] and tty == ""
