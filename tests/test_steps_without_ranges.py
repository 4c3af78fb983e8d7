"""Engine steps of traces that lack vLLM's step ranges (issue 33, item 5): real exports with
their `execute_context_…` ranges, or every NVTX range, or their syncs taken out with sqlite3;
the steps expected are the ones the removed rows delimited, counted in plain SQL over the
original file."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from stepscope.api import open_trace
from stepscope.render.sentences import warning_texts
from tests.conftest import FIXTURES, need, ro

VLLM = FIXTURES / "vllm"
R5 = FIXTURES / "round5"
VLLM_FILES = sorted(p.name for p in VLLM.glob("*.sqlite"))

NAME = "coalesce(e.text, s.value)"
NVTX = "NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"


def _copy(src, tmp_path, name="t.sqlite"):
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    return dst


def _delete(path, sql: str) -> int:
    con = sqlite3.connect(path)
    n = con.execute(sql).rowcount
    con.commit()
    con.close()
    return n


def _gpu_rows(con) -> str:
    """The GPU rows a step holds: its kernels, and the replays of graphs traced whole (one
    CUPTI_ACTIVITY_KIND_GRAPH_TRACE row each, which stepscope reads as one activity)."""
    has = con.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_GRAPH_TRACE'").fetchone()
    return ("(SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
            "SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE)" if has else "CUPTI_ACTIVITY_KIND_KERNEL")


def _kernels_launched(con, lo: int, hi: int) -> int:
    """GPU rows (kernels, whole-graph replays) whose launching call (same process, same
    correlation id) starts in [lo, hi)."""
    return con.execute(f"""SELECT count(*) FROM {_gpu_rows(con)} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                          ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24
                          WHERE r.start >= ? AND r.start < ?""", (lo, hi)).fetchone()[0]


def _vllm_steps_sql(path) -> list[int]:
    """Kernels per vLLM step from SQL alone: from an execute_context range's start to the next
    `schedule: …` range after it (the step's sampling is launched after its range closes)."""
    con = ro(path)
    out = []
    for start, end in con.execute(f"""SELECT e.start, e.end FROM {NVTX}
                                      WHERE {NAME} LIKE 'execute_context%' ORDER BY e.start""").fetchall():
        nxt = con.execute(f"SELECT min(e.start) FROM {NVTX} WHERE {NAME} LIKE 'schedule:%' AND e.start > ?",
                          (end,)).fetchone()[0]
        out.append(_kernels_launched(con, start, nxt if nxt is not None else 1 << 62))
    return out


@pytest.mark.parametrize("name", VLLM_FILES)
def test_steps_from_vllm_schedule_ranges_without_execute_context(name, tmp_path):
    """vLLM's scheduler ranges alone (the step ranges deleted): one step per engine iteration,
    delimiter `schedule`, each with the kernels of the deleted step."""
    src = need(VLLM / name)
    expected = _vllm_steps_sql(src)
    assert expected and all(n > 300 for n in expected)
    path = _copy(src, tmp_path)
    gone = _delete(path, f"""DELETE FROM NVTX_EVENTS WHERE rowid IN (SELECT e.rowid FROM {NVTX}
                             WHERE {NAME} LIKE 'execute_context%')""")
    assert gone == len(expected)
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "schedule").all()
    assert s["n_kernels"].to_list() == expected
    # the capture holds nothing but that step
    assert sum(expected) == ro(src).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def _syncs_sql(path):
    """The 3-step torch trace's steps from SQL: its cudaStreamSynchronize calls (one after each
    step's D2H copy of the sampled token) cut it; kernels and cuDNN SDPA launches (one per
    layer) per step."""
    con = ro(path)
    syncs = [e for (e,) in con.execute("""SELECT r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
                                          ON s.id = r.nameId WHERE s.value LIKE 'cudaStreamSynchronize%'
                                          ORDER BY r.start""")]
    edges = [0] + syncs
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        out.append(con.execute("""
            SELECT count(*), sum(CASE WHEN s.value LIKE 'cudnn_generated_fort_native_sdpa%' THEN 1 ELSE 0 END)
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            WHERE r.start > ? AND r.start < ?""", (lo, hi)).fetchone())
    return out


def _strip_markers(path):
    """No NVTX, no capture range, no host synchronization: only the kernel sequence is left."""
    _delete(path, """DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN (SELECT id FROM StringIds
                     WHERE value LIKE 'cudaStreamSynchronize%' OR value LIKE 'cudaDeviceSynchronize%'
                     OR value LIKE 'cuProfilerStart%' OR value LIKE 'cudaProfilerStart%')""")
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    if "NVTX_EVENTS" in tables:
        _delete(path, "DELETE FROM NVTX_EVENTS")


def test_step_period_told_apart_from_the_layer_period(tmp_path):
    """Three back-to-back llama-3.2-1b decode steps with no NVTX, no capture range and no sync:
    the kernel sequence repeats every layer (58 kernels) and every step (16 layers plus head and
    tail); the steps are the whole-step repeats, cut after each step's D2H copy of its token,
    with the kernels the syncs delimit in SQL."""
    src = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    per_step = _syncs_sql(src)
    path = _copy(src, tmp_path)
    _strip_markers(path)
    assert ro(path).execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                               WHERE s.value LIKE '%Synchronize%' OR s.value LIKE '%ProfilerStart%'""").fetchone()[0] == 0
    s = open_trace(path, cache=False).table
    assert s.height == 3
    assert (s["delimiter"] == "period").all()
    assert s["n_kernels"].to_list() == [n for n, _ in per_step] == [940, 942, 942]
    assert s["layers"].to_list() == [attn for _, attn in per_step] == [16, 16, 16]
    assert s["kernels_per_layer"].to_list() == [58, 58, 58]


def test_step_period_without_copy_directions_cuts_where_the_first_step_begins(tmp_path):
    """The same trace with the copies' direction unknown as well: each step begins as the first
    one does (at its embedding lookup), so the two kernels that write the sampled token into the
    next input end the step before. Still three steps of 16 layers over every kernel."""
    src = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    per_step = _syncs_sql(src)
    path = _copy(src, tmp_path)
    _strip_markers(path)
    _delete(path, "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET copyKind = 0")
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "period").all()
    assert s["layers"].to_list() == [16, 16, 16]
    assert s["n_kernels"].sum() == sum(n for n, _ in per_step)
    assert sorted(s["n_kernels"].to_list()) == sorted(n for n, _ in per_step)
    # every step starts with the embedding lookup (indexSelect), as the first step does in SQL
    first = ro(src).execute("""SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                               ON s.id = k.shortName ORDER BY k.start LIMIT 1""").fetchone()[0]
    assert "indexSelect" in first


EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")


def _plain_capture(path):
    """What a plain `nsys profile` of the engine holds: no NVTX range and no capture range."""
    _delete(path, "DELETE FROM NVTX_EVENTS")
    _delete(path, """DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN (SELECT id FROM StringIds
                     WHERE value LIKE 'cuProfilerStart%' OR value LIKE 'cudaProfilerStart%')""")


def _repeat_run(path, times: int) -> int:
    """The export's one engine step run `times` times back to back: every event row copied, later
    by the step's span plus 1 ms each time, with correlation ids moved past the last one.
    Returns that shift."""
    con = sqlite3.connect(path)
    tables = [t for t in EVENT_TABLES
              if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone()]
    lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    corr = con.execute("SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    hi = max(con.execute(f"SELECT max(end) FROM {t}").fetchone()[0] or hi for t in tables)
    rows = {t: con.execute(f"SELECT max(rowid) FROM {t}").fetchone()[0] or 0 for t in tables}
    for i in range(1, times):
        shift = i * (hi - lo + 1_000_000)
        for t in tables:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
            moved = ", ".join(f"{c} + {shift}" if c in ("start", "end") else
                              f"{c} + {i * (corr + 1)}" if c == "correlationId" else c for c in cols)
            con.execute(f"INSERT INTO {t} ({', '.join(cols)}) SELECT {moved} FROM {t} WHERE rowid <= {rows[t]}")
    con.commit()
    con.close()
    return hi - lo + 1_000_000


@pytest.mark.parametrize("name", VLLM_FILES)
def test_engine_steps_from_the_loop_itself_without_any_range(name, tmp_path):
    """No NVTX and no capture range: one step per input preparation of vLLM's engine loop,
    delimiter `engine`, with the kernels of the deleted execute_context step (SQL over the
    original file)."""
    src = need(VLLM / name)
    expected = _vllm_steps_sql(src)
    path = _copy(src, tmp_path)
    _plain_capture(path)
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == expected


@pytest.mark.parametrize("name", ["llama8b_decode_b8_graph.sqlite", "llama8b_decode_b1_eager.sqlite",
                                  "llama8b_prefill_b1_graph.sqlite"])
def test_engine_steps_of_a_run_cut_after_each_steps_output(name, tmp_path):
    """The real step run three times back to back (rows copied, shifted in time): three engine
    steps, each cut just after the previous one's output (the sampled tokens' copy to the host
    and the state update after it), each with the original step's kernels and its first activity
    the step's first H2D input copy."""
    src = need(VLLM / name)
    (expected,) = _vllm_steps_sql(src)
    path = _copy(src, tmp_path)
    _plain_capture(path)
    shift = _repeat_run(path, 3)
    a = open_trace(path, cache=False)
    s = a.table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == [expected] * 3
    # each step's first launching call is the first memcpy/launch of the original, shifted
    con = ro(src)
    first = con.execute("""SELECT min(r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                           WHERE s.value LIKE 'cudaMemcpy%' OR s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%'
                           OR s.value LIKE 'cudaGraphLaunch%'""").fetchone()[0]
    assert s["w_start"].to_list() == [first + i * shift for i in range(3)]


def test_step_regex_that_matches_nothing_is_named(tmp_path):
    """A --step-regex that matches none of the trace's NVTX range names (checked in SQL) is named
    in a warning, with the delimiter that cut the steps instead."""
    import re

    src = need(VLLM / "llama8b_decode_b1_eager.sqlite")
    names = [n for (n,) in ro(src).execute(f"SELECT DISTINCT {NAME} FROM {NVTX}")]
    regex = r"^no_such_step_\d+$"
    assert names and not any(re.search(regex, n or "") for n in names)
    inv = open_trace(src, step_regex=regex, cache=False).inventory
    (w,) = [w for w in warning_texts(inv.warnings) if "--step-regex" in w]
    assert repr(regex) in w and "matched no NVTX range" in w
    used = inv.steps["delimiter"].unique().to_list()
    assert used == ["schedule"] and "delimited by schedule" in w


# --- whole vLLM runs under plain `nsys profile` (fixtures/serving/README.md) --------------------

SERVING = FIXTURES / "serving"


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """The two whole-run captures, unpacked: `scopes` (VLLM_NVTX_SCOPES_FOR_PROFILING=1,
    --cuda-graph-trace=node) and `bare` (neither)."""
    import gzip

    out = {}
    d = tmp_path_factory.mktemp("serving")
    for kind in ("scopes", "bare"):
        src = need(SERVING / f"llama1b_serve_r16_graph_plain_{kind}.sqlite.gz")
        dst = d / f"{kind}.sqlite"
        with gzip.open(src, "rb") as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
        out[kind] = dst
    return out


_ITERATIONS: dict = {}


def _iterations_sql(path) -> list[int]:
    """Kernels per engine iteration from vLLM's scheduler ranges, in SQL: every schedule() call
    writes one `schedule: update_after_schedule` range, and the iteration's launches follow it
    up to the next one; iterations that launched nothing left out. Counted once per export (three
    tests compare against the scoped run's), a fresh list each time."""
    if path not in _ITERATIONS:
        _ITERATIONS[path] = _iterations_counted(path)
    return list(_ITERATIONS[path])


def _iterations_counted(path) -> list[int]:
    con = ro(path)
    b = [s for (s,) in con.execute(f"""SELECT e.start FROM {NVTX} WHERE {NAME} = 'schedule: update_after_schedule'
                                       ORDER BY e.start""")]
    counts = [_kernels_launched(con, lo, hi) for lo, hi in zip(b, b[1:] + [1 << 62])]
    return [n for n in counts if n]


def _first_schedule(path) -> int:
    return ro(path).execute(f"SELECT min(e.start) FROM {NVTX} WHERE {NAME} LIKE 'schedule:%'").fetchone()[0]


def _calls_before(path, like: str, until: int) -> int:
    return ro(path).execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                               WHERE s.value LIKE ? AND r.start < ?""", (like, until)).fetchone()[0]


def test_whole_run_with_vllm_scopes_is_its_engine_iterations(serving):
    """A 16-request llama-3.2-1b run, start-up included, with vLLM's scheduler ranges: one step
    per iteration that launched work (99, each with the kernels SQL finds after its scheduling),
    and the 48 s before the first iteration named as start-up, not a step."""
    path = serving["scopes"]
    expected = _iterations_sql(path)
    assert len(expected) == 99
    a = open_trace(path, cache=False)
    s = a.table
    assert (s["delimiter"] == "schedule").all()
    assert s["n_kernels"].to_list() == expected
    (row,) = a.inventory.startup.to_dicts()
    first = _first_schedule(path)
    assert row["end_ns"] == first
    assert row["graph_captures"] == _calls_before(path, "cudaStreamEndCapture%", first) == 194
    assert row["kernels"] == _kernels_launched(ro(path), 0, first)
    assert row["duration_ns"] > 40e9 and s["step_time_ns"].max() < 1e9
    assert "torch.compile" in row["evidence"] and "CUDA-graph capture (194 graphs)" in row["evidence"]
    assert a.to_dict()["startup"][0]["graph_captures"] == 194


def test_whole_run_without_any_range_finds_the_same_iterations(serving, tmp_path):
    """The same capture with every NVTX range deleted: vLLM's engine loop alone gives the same 99
    steps, each with the kernels of the scheduler's iteration (SQL over the original ranges)."""
    expected = _iterations_sql(serving["scopes"])
    path = _copy(serving["scopes"], tmp_path)
    _delete(path, "DELETE FROM NVTX_EVENTS")
    a = open_trace(path, cache=False)
    s = a.table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == expected
    (row,) = a.inventory.startup.to_dicts()
    # the start-up ends where the first iteration's input preparation begins, after its scheduling
    first = _first_schedule(serving["scopes"])
    assert first < row["end_ns"] < first + 10_000_000
    assert row["graph_captures"] == 194


def test_plain_capture_without_scopes_or_node_tracing(serving):
    """The capture most users make (plain nsys profile, no vLLM scopes, graphs traced as whole
    replays): as many engine steps as the scoped run of the same seeded workload had iterations,
    none of them the start-up (the issue saw 16.4 s and 15.1 s "steps" cut at graph launches)."""
    path = serving["bare"]
    # its only NVTX ranges are CUB's own (cub::DeviceScan…): none of vLLM's
    assert ro(path).execute(f"""SELECT count(*) FROM {NVTX} WHERE {NAME} LIKE 'schedule:%'
                                OR {NAME} LIKE 'execute_context%' OR {NAME} LIKE 'llm_engine%'""").fetchone()[0] == 0
    a = open_trace(path, cache=False)
    s = a.table
    assert (s["delimiter"] == "engine").all()
    assert s.height == len(_iterations_sql(serving["scopes"])) == 99
    assert s["step_time_ns"].max() < 100e6
    (row,) = a.inventory.startup.to_dicts()
    assert row["graph_captures"] == _calls_before(path, "cudaStreamEndCapture%", row["end_ns"]) == 194
    # every kernel is in a step or in the start-up, but for what ran after the last step's launches
    total = ro(path).execute(f"SELECT count(*) FROM {_gpu_rows(ro(path))}").fetchone()[0]
    assert row["kernels"] + s["n_kernels"].sum() == total


# --- plain whole-run captures of MoE, FP8 and MLA models (fixtures/models/README.md) -----------

MODELS = FIXTURES / "models"
MODEL_RUNS = ("qwen3-30b-a3b_r32_graph_plain", "llama-3.1-8b-fp8_r32_graph_plain", "deepseek-v2-lite_r32_graph_plain")


@pytest.mark.parametrize("name", MODEL_RUNS)
def test_models_without_any_range_find_the_scheduler_iterations(name, tmp_path):
    """MoE (Qwen3-30B-A3B, vLLM's V1 model runner), FP8 and MLA+MoE (DeepSeek-V2-Lite, V2 runner)
    plain captures, node-level graph rows: each is its own twin. With vLLM's scheduler ranges the
    steps are the iterations that launched work, each with the kernels SQL finds after its
    scheduling; with every NVTX row deleted the engine loop alone finds the same steps, kernel
    for kernel, and the start-up ends where the first one begins."""
    from tests.conftest import gunzipped

    src = gunzipped(need(MODELS / f"{name}.sqlite.gz"))
    con = ro(src)
    calls = con.execute(f"SELECT count(*) FROM {NVTX} WHERE {NAME} = 'schedule: update_after_schedule'").fetchone()[0]
    assert calls == 67  # the README's 67 scheduler calls
    expected = _iterations_sql(src)
    assert 0.95 * calls <= len(expected) <= calls  # a scheduler call or two with nothing to launch
    with_ranges = open_trace(src, cache=False).table
    assert (with_ranges["delimiter"] == "schedule").all()
    assert with_ranges["n_kernels"].to_list() == expected
    path = _copy(src, tmp_path)
    assert _delete(path, "DELETE FROM NVTX_EVENTS") > 0
    a = open_trace(path, cache=False)
    s = a.table
    assert (s["delimiter"] == "engine").all()
    assert abs(s.height - with_ranges.height) <= 0.02 * with_ranges.height
    assert s["n_kernels"].to_list() == expected
    # every kernel launched before the first iteration's scheduling is start-up, in no step
    (row,) = a.inventory.startup.to_dicts()
    first = _first_schedule(src)
    assert row["kernels"] == _kernels_launched(con, 0, first)
    assert first < row["end_ns"] < first + 200_000_000
    assert row["graph_captures"] == _calls_before(src, "cudaStreamEndCapture%", first) > 0


def _graph_level(path) -> int:
    """What nsys's default --cuda-graph-trace=graph writes, made from node-level rows: every CUDA
    graph replay one CUPTI_ACTIVITY_KIND_GRAPH_TRACE row (its nodes' first start to last end)
    and its kernels' rows gone. Returns the replays."""
    con = sqlite3.connect(path)
    con.execute("""CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL,
                   deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
                   streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, graphId INTEGER NOT NULL,
                   graphExecId INTEGER NOT NULL)""")
    n = con.execute("""INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE SELECT min(start), max(end), deviceId, contextId,
                       0, streamId, correlationId, globalPid, 0, 0 FROM CUPTI_ACTIVITY_KIND_KERNEL
                       WHERE graphNodeId IS NOT NULL GROUP BY globalPid, correlationId""").rowcount
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL")
    con.commit()
    con.close()
    return n


@pytest.mark.parametrize("name", MODEL_RUNS)
def test_models_with_graph_level_rows_without_any_range(name, tmp_path):
    """The same runs as nsys's default graph-level rows would have recorded them (each replay one
    row, its kernels none): with the scheduler ranges and without any range, the same steps, each
    with the kernels SQL finds after its scheduling in that copy."""
    from tests.conftest import gunzipped

    src = gunzipped(need(MODELS / f"{name}.sqlite.gz"))
    graph = _copy(src, tmp_path, "graph.sqlite")
    assert _graph_level(graph) > 0
    expected = _iterations_counted(graph)
    with_ranges = open_trace(graph, cache=False).table
    assert (with_ranges["delimiter"] == "schedule").all()
    assert with_ranges["n_kernels"].to_list() == expected
    bare = _copy(graph, tmp_path, "bare.sqlite")
    _delete(bare, "DELETE FROM NVTX_EVENTS")
    s = open_trace(bare, cache=False).table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == expected
    assert s["n_graph_launches"].to_list() == with_ranges["n_graph_launches"].to_list()
    assert s["n_graph_launches"].sum() > 0


SERVE = FIXTURES / "vllm_serve"


def test_serve_hooks_without_nvtx_finds_its_execute_context_steps(tmp_path):
    """The `vllm serve` capture with the profiler hooks (node-level rows, a capture range): its
    227 execute_context ranges, 225 with GPU work. With its NVTX deleted the engine loop finds
    the 225 steps, each with the kernels SQL finds from its range's start to the next one's."""
    from tests.conftest import gunzipped

    src = gunzipped(need(SERVE / "llama-3.1-8b_serve_hooks.sqlite.gz"))
    con = ro(src)
    starts = [s for (s,) in con.execute(f"SELECT e.start FROM {NVTX} WHERE {NAME} LIKE 'execute_context%' "
                                        "ORDER BY e.start")]
    assert len(starts) == 227
    counts = [_kernels_launched(con, lo, hi) for lo, hi in zip(starts, starts[1:] + [1 << 62])]
    expected = [n for n in counts if n]
    assert len(expected) == 225
    path = _copy(src, tmp_path)
    _delete(path, "DELETE FROM NVTX_EVENTS")
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == expected
    assert s["n_kernels"].sum() == con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def _driver_marks(log) -> dict:
    """The serve driver's summary line (fixtures/capture_serve.py) in the capture's .log."""
    import json

    (line,) = [x for x in log.read_text(encoding="utf-8").splitlines() if x.startswith("capture_serve: {")]
    return json.loads(line[len("capture_serve: "):])


def test_serve_flush_graph_level_rows_steps_are_the_traffic_iterations():
    """The plain `vllm serve` capture with --cuda-flush-interval=1000: graph-level CUDA-graph rows
    and no range at all. Its engine steps are the iterations of the traffic: one per input
    preparation (`_prepare_pos_seq_lens_kernel`, once per iteration of vLLM's V2 model runner)
    launched after the driver began sending requests, on the session's clock (the driver's own
    marks in the .log, UTC, against TARGET_INFO_SESSION_START_TIME): none of the start-up's
    iterations, and every CUDA-graph replay of the traffic in a step."""
    from tests.conftest import gunzipped

    src = gunzipped(need(SERVE / "llama-3.1-8b_serve_flush.sqlite.gz"))
    con = ro(src)
    d = _driver_marks(SERVE / "llama-3.1-8b_serve_flush.log")
    epoch = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    traffic = int((d["t0_unix"] + d["marks"]["traffic_start"]) * 1e9) - epoch
    expected = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                              WHERE s.value = '_prepare_pos_seq_lens_kernel' AND k.start > ?""", (traffic,)).fetchone()[0]
    replays = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                             WHERE s.value LIKE 'cudaGraphLaunch%' AND r.start > ?""", (traffic,)).fetchone()[0]
    assert expected > 100 and replays > 0
    a = open_trace(src, cache=False)
    s = a.table
    assert (s["delimiter"] == "engine").all()
    assert s.height == expected
    assert s["w_start"].min() > traffic
    assert s["n_graph_launches"].sum() == replays


def test_an_idle_server_between_two_bursts_is_between_steps(tmp_path):
    """The flush capture with 30 s of idleness put between two of its traffic's iterations (every
    CUDA call from the first one after an iteration's last device-to-host copy on, and the GPU
    work they launched, moved 30 s later, in SQL): the same steps with the same kernels, and the
    idle time in none of them (no step of 30 s: the step before it ends with its last call)."""
    from tests.conftest import gunzipped

    src = gunzipped(need(SERVE / "llama-3.1-8b_serve_flush.sqlite.gz"))
    con = ro(src)
    d = _driver_marks(SERVE / "llama-3.1-8b_serve_flush.log")
    traffic = int((d["t0_unix"] + d["marks"]["traffic_start"]) * 1e9) - con.execute(
        "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    preps = [s for (s,) in con.execute("""SELECT r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                                          ON s.id = k.shortName JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                                          ON r.correlationId = k.correlationId
                                          WHERE s.value = '_prepare_pos_seq_lens_kernel' AND k.start > ?
                                          ORDER BY r.start""", (traffic,))]
    # the iteration's output side: its sampled tokens' copy to the host and the state update after it
    copy_out = con.execute("""SELECT max(r.end) FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.start < ? AND (
                                  r.correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY
                                                      WHERE copyKind = 2)
                                  OR r.correlationId IN (SELECT k.correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                                         JOIN StringIds s ON s.id = k.shortName
                                                         WHERE s.value IN ('_post_update_kernel',
                                                                           '_get_num_sampled_and_rejected_kernel')))""",
                           (preps[50],)).fetchone()[0]
    cut = con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start > ?", (copy_out,)).fetchone()[0]
    assert preps[49] < cut <= preps[50]
    idle = 30_000_000_000
    path = _copy(src, tmp_path)
    c = sqlite3.connect(path)
    # GPU work by its launching call (work launched before the cut ran before it, as it would)
    launched = f"SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start >= {cut}"
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
        c.execute(f"UPDATE {t} SET start = start + {idle}, end = end + {idle} WHERE correlationId IN ({launched})")
    for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
        c.execute(f"UPDATE {t} SET start = start + {idle}, end = end + {idle} WHERE start >= {cut}")
    c.execute(f"UPDATE ANALYSIS_DETAILS SET duration = duration + {idle}")
    c.commit()
    c.close()
    before = open_trace(src, cache=False).table
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "engine").all()
    assert s.height == before.height == len(preps)
    assert s["n_kernels"].to_list() == before["n_kernels"].to_list()
    assert s["step_time_ns"].max() < 1e9
    (i,) = [j for j in range(s.height - 1) if s["step_begin"][j + 1] - s["step_end"][j] > idle - 100_000_000]
    assert s["w_end"][i] < cut and s["step_begin"][i + 1] >= cut + idle  # the host side: its calls end before


# --- tenth round: long prompts (up to 3,000 tokens, chunked prefill) with nsys's default
# graph-level rows and with node-level rows, and an eager MoE run through the profiler hooks ---

LONG_RUNS = ("llama-3.2-1b_r16_long_graph_plain", "llama-3.2-1b_r16_long_node_plain")


@pytest.mark.parametrize("name", LONG_RUNS)
def test_long_prompt_runs_without_any_range_find_the_scheduler_iterations(name, tmp_path):
    """Each long-prompt capture is its own twin: with vLLM's scheduler ranges, the 89 iterations
    that launched work of its 91 scheduler calls, each with the kernels (or graph replays) SQL
    finds after its scheduling; with every NVTX row deleted the engine loop finds the same."""
    from tests.conftest import gunzipped

    src = gunzipped(need(MODELS / f"{name}.sqlite.gz"))
    con = ro(src)
    assert con.execute(f"SELECT count(*) FROM {NVTX} WHERE {NAME} = 'schedule: update_after_schedule'"
                       ).fetchone()[0] == 91
    expected = _iterations_sql(src)
    assert len(expected) == 89
    with_ranges = open_trace(src, cache=False).table
    assert (with_ranges["delimiter"] == "schedule").all()
    assert with_ranges["n_kernels"].to_list() == expected
    path = _copy(src, tmp_path)
    assert _delete(path, "DELETE FROM NVTX_EVENTS") > 0
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == expected
    if "graph" in name:  # whole replays: one GPU row per graph launch
        assert s["n_graph_launches"].to_list() == with_ranges["n_graph_launches"].to_list()
        assert s["n_graph_launches"].sum() > 0


def test_eager_moe_hooks_without_nvtx_finds_its_execute_context_steps(tmp_path):
    """The eager Qwen3-30B-A3B run of `stepscope trace` (profiler hooks): 66 execute_context
    ranges, 65 with GPU work, each with the kernels SQL finds from its start to the next
    scheduling; with its NVTX deleted the engine loop finds the same 65 steps."""
    from tests.conftest import gunzipped

    src = gunzipped(need(MODELS / "qwen3-30b-a3b_serve_r16_s0_eager.sqlite.gz"))
    expected = _vllm_steps_sql(src)
    assert len(expected) == 66
    expected = [n for n in expected if n > 0]
    assert len(expected) == 65
    assert open_trace(src, cache=False).table["n_kernels"].to_list() == expected
    path = _copy(src, tmp_path)
    assert _delete(path, "DELETE FROM NVTX_EVENTS") > 0
    s = open_trace(path, cache=False).table
    assert (s["delimiter"] == "engine").all()
    assert s["n_kernels"].to_list() == expected
