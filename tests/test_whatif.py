"""The what-if CUDA-graph model (issue 28): one model, its calibration measured on the committed
graph captures, a range that holds every committed pair's measured graph step, tp equal to
analyze, `stepscope calibrate` and `--calibration`. Measured values come from plain SQL."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import CliRunner

import stepscope
from stepscope import library
from stepscope.analysis import tp as tpm
from stepscope.analysis.whatif import (FIGURES, Calibration, bundled, graph_step, point_of,
                                       step_figures)
from stepscope.cli import app
from tests.conftest import FIXTURES, gunzipped, need, ro

# every committed eager/graph pair of one step shape (fixtures/README.md): (eager, graph)
PAIRS = [
    ("llama8b_decode_b1_eager", "llama8b_decode_b1_graph"),
    ("llama8b_decode_b8_eager", "llama8b_decode_b8_graph"),
    ("llama8b_decode_b1_eager_r4", "llama8b_decode_b1_graph_r4"),
    ("llama8b_decode_b1_eager_tp2", "llama8b_decode_b1_graph_tp2"),
    ("round5/llama8b_decode_b1_eager", "round5/llama8b_decode_b1_graph"),
    ("round5/llama8b_decode_b8_eager", "round5/llama8b_decode_b8_graph"),
    ("vllm/llama8b_decode_b1_eager", "vllm/llama8b_decode_b1_graph"),
    ("vllm/llama8b_decode_b8_eager", "vllm/llama8b_decode_b8_graph"),
    ("vllm/qwen7b_decode_b1_eager", "vllm/qwen7b_decode_b1_graph"),
    # the seventh device round's pairs (another model size, batch 1-32, both engines): these two
    # calibrate, the HELD_OUT ones never do
    ("pairs/torch_llama-3.2-1b_decode_b1_eager", "pairs/torch_llama-3.2-1b_decode_b1_graph"),
    ("pairs/vllm_llama-3.2-1b_decode_b1_eager", "pairs/vllm_llama-3.2-1b_decode_b1_graph"),
]
HELD_OUT = [(f"pairs/{n}_eager", f"pairs/{n}_graph") for n in (
    "torch_llama-3.2-1b_decode_b32", "torch_qwen2.5-7b_decode_b16", "vllm_llama-3.2-1b_decode_b32",
    "vllm_llama-3.1-8b_decode_b32")]
# the eighth device round: the two pairs over 10 % above, each captured twice more with its own
# command (fixtures/README.md); held out, and not held to 10 %: see test_repeated_pairs
REPEATS = {"pairs/vllm_llama-3.2-1b_decode_b1": [f"round8/vllm_llama-3.2-1b_decode_b1_{{}}_rep{r}" for r in (1, 2)],
           "vllm/qwen7b_decode_b1": [f"round8/vllm_qwen2.5-7b_decode_b1_{{}}_rep{r}" for r in (1, 2)]}
REPEATED = [(n.format("eager"), n.format("graph")) for ns in REPEATS.values() for n in ns]
# their point errors (%) with the bundled calibration (docs/WHATIF.md)
REPEATED_ERRORS = {"round8/vllm_llama-3.2-1b_decode_b1_eager_rep1": 16.0,
                   "round8/vllm_llama-3.2-1b_decode_b1_eager_rep2": 17.7,
                   "round8/vllm_qwen2.5-7b_decode_b1_eager_rep1": -9.2,
                   "round8/vllm_qwen2.5-7b_decode_b1_eager_rep2": 4.1}
# vLLM runs a 2048-token prefill eagerly in graph mode too (above its largest capture size): that
# "graph" capture has no replay, so it neither calibrates nor checks the what-if
NO_REPLAY = "vllm/llama8b_prefill_b1_graph"

# The point error (%) of each pair, calibrated without the pair's own graph capture (docs/WHATIF.md)
LEAVE_ONE_OUT = {
    "llama8b_decode_b1_eager": 1.4, "llama8b_decode_b8_eager": -1.1, "llama8b_decode_b1_eager_r4": 0.1,
    "llama8b_decode_b1_eager_tp2": -1.1, "round5/llama8b_decode_b1_eager": 0.3,
    "round5/llama8b_decode_b8_eager": 0.6, "vllm/llama8b_decode_b1_eager": -4.2,
    "vllm/llama8b_decode_b8_eager": -7.4, "vllm/qwen7b_decode_b1_eager": 15.1,
    "pairs/torch_llama-3.2-1b_decode_b1_eager": -2.6, "pairs/vllm_llama-3.2-1b_decode_b1_eager": -12.5,
}
# the point error (%) of the held-out pairs with the bundled calibration (docs/WHATIF.md)
HELD_OUT_ERRORS = {"pairs/torch_llama-3.2-1b_decode_b32_eager": 0.7, "pairs/torch_qwen2.5-7b_decode_b16_eager": 0.4,
                   "pairs/vllm_llama-3.2-1b_decode_b32_eager": -10.0, "pairs/vllm_llama-3.1-8b_decode_b32_eager": -9.2}


def fx(name: str):
    gz = FIXTURES / f"{name}.sqlite.gz"  # the eighth round's exports are committed gzip'd
    return gunzipped(gz) if gz.exists() else need(FIXTURES / f"{name}.sqlite")


_COMPARED: dict[tuple[str, str], str] = {}


def compared(eager: str, graph: str) -> dict:
    """stepscope.compare of a committed pair with the bundled calibration (as the suite's config
    holds none), computed once per worker for the tests that read it: a fresh copy each time
    (the document's JSON text parsed again), so no test sees another's changes."""
    if (eager, graph) not in _COMPARED:
        from stepscope.calibration import default_calibration

        assert default_calibration() is bundled()  # no user file, no calibration given
        _COMPARED[eager, graph] = json.dumps(stepscope.compare(fx(eager), fx(graph)))
    return json.loads(_COMPARED[eager, graph])


# The step time of every NVTX step (torch: `step …` ranges; vLLM: an execute_context range's window
# to the next schedule/step range on its thread), per thread: the later of the window's end and
# the last end of the activities its launches issued, less the window's start.
STEP_SQL = """
WITH names AS (
  SELECT n.start, n.end, n.globalTid AS gtid, coalesce(n.text, s.value) AS name
  FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60)
), steps AS (
  SELECT start AS s0, gtid,
         CASE WHEN name LIKE 'execute_context%' THEN
           coalesce((SELECT min(m.start) FROM names m WHERE m.gtid = names.gtid AND m.start > names.start
                     AND (m.name LIKE 'schedule%' OR m.name LIKE 'execute_context%')), end)
         ELSE end END AS s1
  FROM names WHERE name LIKE 'step %' OR name LIKE 'execute_context%'
), acts AS (
  SELECT end, correlationId AS corr, globalPid AS gpid FROM CUPTI_ACTIVITY_KIND_KERNEL {memops}
)
SELECT (steps.gtid >> 24) & 16777215, max(steps.s1, max(a.end)) - steps.s0
FROM steps JOIN CUPTI_ACTIVITY_KIND_RUNTIME c ON c.globalTid = steps.gtid AND c.start BETWEEN steps.s0 AND steps.s1
JOIN acts a ON a.corr = c.correlationId AND (a.gpid >> 24) = (c.globalTid >> 24)
GROUP BY steps.gtid, steps.s0 ORDER BY steps.s0
"""


def sql_step_times(path) -> dict[int, int]:
    """pid → step time (the captures here hold one step per process)."""
    con = ro(path)
    tabs = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    memops = "".join(f" UNION ALL SELECT end, correlationId, globalPid FROM {t}"
                     for t in ("CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MEMCPY") if t in tabs)
    return dict(con.execute(STEP_SQL.format(memops=memops)).fetchall())


def sql_lead(path) -> float:
    """Median over graph launches of: first graph node's start − the cudaGraphLaunch call's start."""
    rows = ro(path).execute("""
        SELECT min(k.start) - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId
             AND (k.globalPid >> 24) = (r.globalTid >> 24) AND k.graphNodeId IS NOT NULL
        WHERE s.value LIKE 'cudaGraphLaunch%' GROUP BY r.globalTid, r.correlationId""").fetchall()
    return statistics.median(r[0] for r in rows)


def test_bundled_calibration_is_the_committed_graph_captures():
    cal = bundled()
    graphs = {g for _, g in PAIRS}
    assert {c.source for c in cal.captures} == {f"fixtures/{g}.sqlite" for g in graphs}
    for c in cal.captures:
        path = FIXTURES.parent / c.source
        assert c.graph_launch_lead_ns == pytest.approx(sql_lead(need(path)), abs=0.5)
        assert c.gpu == "NVIDIA H200" and c.engine == ("vllm" if "vllm" in c.source else "torch")
        assert c.nodes == ro(path).execute(
            "SELECT count(*) / count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL"
        ).fetchone()[0]
        assert c.eager_twin == c.source.replace("graph", "eager")
    # calibrate measures the same again from the files
    again = library.calibrate([FIXTURES.parent / c.source for c in cal.captures]
                              + [FIXTURES.parent / c.eager_twin for c in cal.captures])
    assert [(c.graph_launch_lead_ns, c.node_gap_ns, c.memop_gap_ns, c.device_ratio, c.residual)
            for c in again.captures] == [(c.graph_launch_lead_ns, c.node_gap_ns, c.memop_gap_ns, c.device_ratio,
                                          c.residual) for c in cal.captures]


@pytest.mark.parametrize("eager,graph", PAIRS + HELD_OUT + REPEATED, ids=[p[0] for p in PAIRS + HELD_OUT + REPEATED])
def test_every_committed_pair_lies_inside_its_range(eager, graph):
    doc = compared(eager, graph)
    measured = sql_step_times(fx(graph))[doc["b"]["rank"]["pid"] if "rank" in doc["b"] else
                                         next(iter(sql_step_times(fx(graph))))]
    assert doc["prediction_reference_ns"] == measured
    lo, point, hi = (doc[f"predicted_graph_step_{k}_ns"] for k in ("low", "time", "high"))
    assert lo <= point <= hi
    assert lo <= measured <= hi, f"{graph}: {measured} outside {lo}..{hi}"
    assert doc["prediction_in_range"]
    # the calibration is named: its engine's captures, each with GPU, engine, nodes and file
    g = doc["graph_constants"]
    assert g["engine"] == ("vllm" if "vllm" in eager else "torch")
    assert g["captures"] and all({"source", "gpu", "engine", "nodes"} <= set(c) for c in g["captures"])
    assert all(c["engine"] == g["engine"] for c in g["captures"])


def test_the_prefill_graph_capture_has_no_replay():
    cal = library.calibrate([fx(NO_REPLAY), fx(PAIRS[0][1])])
    assert len(cal.captures) == 1 and "no CUDA-graph replay" in cal.notes[0]
    assert ro(fx(NO_REPLAY)).execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL").fetchone()[0] == 0


@pytest.mark.parametrize("eager,graph", PAIRS, ids=[p[0] for p in PAIRS])
def test_leave_one_out_point_error(eager, graph):
    """Calibrated without the pair's own graph capture: the errors docs/WHATIF.md reports."""
    full = bundled()
    held_out = Calibration(tuple(c for c in full.captures if c.source != f"fixtures/{graph}.sqlite"), "held out")
    assert len(held_out.captures) == len(full.captures) - 1
    doc = stepscope.compare(fx(eager), fx(graph), calibration=held_out)
    err = 100 * (doc["predicted_graph_step_time_ns"] - doc["prediction_reference_ns"]) / doc["prediction_reference_ns"]
    assert err == pytest.approx(LEAVE_ONE_OUT[eager], abs=0.1)


@pytest.mark.parametrize("eager,graph", HELD_OUT, ids=[p[0] for p in HELD_OUT])
def test_held_out_pairs(eager, graph):
    """Pairs no calibration capture comes from: the point within 10 % (vLLM llama-3.2-1b b32:
    −9.96 %), as docs/WHATIF.md reports."""
    assert not any(graph in c.source for c in bundled().captures)
    doc = compared(eager, graph)
    err = 100 * doc["prediction_error"]
    assert err == pytest.approx(HELD_OUT_ERRORS[eager], abs=0.1) and abs(err) < 10


def test_repeated_pairs():
    """Three runs of one command measure a host-bound vLLM graph step 21-33 % apart (plain SQL):
    more than 1.1² apart, so no single prediction can be within 10 % of each run. Against the mean
    of the three runs the bundled point is within 6 %; each repeat's error is docs/WHATIF.md's."""
    for first, again in REPEATS.items():
        runs = [(f"{first}_eager", f"{first}_graph")] + [(n.format("eager"), n.format("graph")) for n in again]
        measured = [next(iter(sql_step_times(fx(g)).values())) for _, g in runs]
        assert max(measured) / min(measured) > 1.1 ** 2, (first, measured)
        docs = [compared(e, g) for e, g in runs]
        assert [d["prediction_reference_ns"] for d in docs] == measured
        mean = statistics.fmean(measured)
        for (e, _), d in zip(runs, docs):
            assert abs(d["predicted_graph_step_time_ns"] / mean - 1) < 0.06, (e, d["predicted_graph_step_time_ns"], mean)
            if e in REPEATED_ERRORS:  # the repeats: held out, each with its own error
                assert not any(e.replace("eager", "graph") in c.source for c in bundled().captures)
                assert 100 * d["prediction_error"] == pytest.approx(REPEATED_ERRORS[e], abs=0.1)
            assert d["prediction_in_range"]


def test_point_within_10_percent_except_where_the_graph_runs_host_drifted():
    """Within 10 % on every pair but two vLLM pairs whose graph run's host differed from the
    others': the qwen pair (30 % faster: prologue 1.55 ms against 2.08–2.48 ms) and the seventh
    round's llama-3.2-1b b1 pair (slower: prologue 2.48 ms, 3.24 ms after the graph launch against
    the 2.94 ms median). The first machine's two torch pairs (graph launch lead 0.92 and 1.05 ms,
    eight times the others') are within 1 % since the point takes the captures of the step's
    memset mode. B's own constants bring each within 2 %."""
    off = {"vllm/qwen7b_decode_b1_eager", "pairs/vllm_llama-3.2-1b_decode_b1_eager"}
    for eager, graph in PAIRS:
        doc = compared(eager, graph)
        assert (abs(doc["prediction_error"]) < 0.10) == (eager not in off), eager
        assert abs(doc["with_b_constants"]["prediction_error"]) < 0.02 or eager.endswith("tp2"), eager


def test_the_graph_launch_lead_follows_the_memset_mode_in_plain_sql():
    """Every committed graph capture: its replay has memsets throughout (≥ 1 memset per 64
    kernels) exactly when its graph launch lead is short (< 0.2 ms) — why the point takes the
    captures of the step's mode (docs/DEFINITIONS.md, "Memset mode")."""
    from stepscope.calibration import with_memsets

    for c in bundled().captures:
        path = need(FIXTURES.parent / c.source)
        con = ro(path)
        k, m, devs = con.execute("""
            SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL),
                   (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE graphNodeId IS NOT NULL),
                   (SELECT count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL)""").fetchone()
        assert (c.nodes, c.memops) == (k // devs, m // devs), c.source
        assert with_memsets(m // devs, k // devs) == (sql_lead(path) < 200_000), (c.source, m, k, sql_lead(path))


def test_graph_step_is_one_function_of_a_steps_figures():
    """The frame's prediction is graph_step over the step's own figures, computed by hand."""
    d = library.diagnosis(fx("vllm/llama8b_decode_b1_eager"))
    pro = d.prologue.row(0, named=True)
    figs = {**pro, "device_floor_ns": d.floors["device_floor_ns"][0]}
    c = point_of(d.inv)
    assert pro["prologue_launches"] == 10 and c.prologue_host_ns is not None
    want = (c.prologue_host_ns + c.graph_launch_prep_ns + c.graph_launch_lead_ns
            + (figs["device_floor_ns"] - pro["prologue_busy_ns"]) * c.device_ratio
            + pro["forward_kernels"] * c.node_gap_ns + pro["forward_memops"] * c.memop_gap_ns)
    assert graph_step(*step_figures(figs), c) == pytest.approx(want)
    assert d.verdicts["predicted_graph_step_time_ns"][0] == round(want)
    assert set(FIGURES) <= set(figs)


@pytest.mark.parametrize("name", ["llama8b_decode_b1_eager", "llama8b_decode_b1_eager_tp2",
                                  "vllm/llama8b_decode_b1_eager"])
def test_tp_graph_mode_at_its_own_width_is_analyzes_whatif(name):
    d = library.diagnosis(fx(name))
    p = tpm.project_trace(d)
    w0 = p.inputs["base_tp"]
    row = next(r for r in p.graph.rows if r["tp"] == w0)
    want = d.verdicts.filter(d.verdicts["step"] == p.inputs["step"])["predicted_graph_step_time_ns"][0]
    assert row["step_time_ns"] == want
    # the same through the CLI
    doc = json.loads(CliRunner().invoke(app, ["tp", str(fx(name)), "--json"]).stdout)
    assert next(r for r in doc["projections"]["graph"]["rows"] if r["tp"] == w0)["step_time_ns"] == want


def test_calibrate_writes_a_file_later_commands_use(tmp_path, monkeypatch):
    out = tmp_path / "cal.json"
    r = CliRunner().invoke(app, ["calibrate", str(fx("round5/llama8b_decode_b1_graph")),
                                 str(fx("round5/llama8b_decode_b1_eager")), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "graph launch lead" in r.stdout and "eager twin" in r.stdout
    doc = json.loads(out.read_text())
    (cap,) = doc["captures"]
    assert cap["graph_launch_lead_ns"] == pytest.approx(sql_lead(fx("round5/llama8b_decode_b1_graph")), abs=0.5)
    # analyze --calibration: the one capture's constants, named in the document
    a = json.loads(CliRunner().invoke(app, ["analyze", str(fx("round5/llama8b_decode_b1_eager")), "--json",
                                            "--calibration", str(out)]).stdout)
    assert [c["source"] for c in a["whatif_calibration"]["captures"]] == [cap["source"]]
    f = a["steps"][0]["floors"]
    measured = sql_step_times(fx("round5/llama8b_decode_b1_graph"))
    (ref,) = measured.values()
    # its own pair, with its own constants and twin: the model's residual on it, no more
    assert abs(f["predicted_graph_step_time_ns"] - ref) <= (abs(cap["residual"]) + 1e-5) * ref  # 5 decimals
    assert f["predicted_graph_step_low_ns"] == f["predicted_graph_step_time_ns"] == f["predicted_graph_step_high_ns"]
    # without --calibration: the user's config file, when there is one
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    r = CliRunner().invoke(app, ["calibrate", str(fx("vllm/qwen7b_decode_b1_graph"))])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cfg" / "stepscope" / "calibration.json").is_file()
    t = json.loads(CliRunner().invoke(app, ["tp", str(fx("vllm/llama8b_decode_b1_eager")), "--json"]).stdout)
    assert t["projections"]["graph"]["rows"][0]["step_time_ns"] > 0
    c = json.loads(CliRunner().invoke(app, ["compare", str(fx("vllm/llama8b_decode_b1_eager")),
                                            str(fx("vllm/llama8b_decode_b1_graph")), "--json"]).stdout)
    assert [x["source"] for x in c["graph_constants"]["captures"]] == [str(fx("vllm/qwen7b_decode_b1_graph"))]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    c = json.loads(CliRunner().invoke(app, ["compare", str(fx("vllm/llama8b_decode_b1_eager")),
                                            str(fx("vllm/llama8b_decode_b1_graph")), "--json"]).stdout)
    assert c["graph_constants"]["origin"] == "bundled"


def test_compare_says_what_the_prediction_would_have_been_with_bs_constants():
    doc = compared("llama8b_decode_b8_eager", "llama8b_decode_b8_graph")
    wb = doc["with_b_constants"]
    assert wb["capture"]["graph_launch_lead_ns"] == pytest.approx(sql_lead(fx("llama8b_decode_b8_graph")), abs=0.5)
    assert abs(wb["prediction_error"]) < abs(doc["prediction_error"])
    assert "with the constants measured on B itself" in doc["verdict"]


@pytest.mark.parametrize("text, why", [("{}", "format"), ('{"format": "stepscope-calibration/1", "captures": []}',
                                                         "no capture"), ("not json", "not a stepscope")])
def test_a_bad_calibration_file_is_one_line(tmp_path, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    r = CliRunner().invoke(app, ["analyze", "--calibration", str(bad)])
    assert r.exit_code == 2 and why in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1
    assert bad.read_text() == text


def test_calibrate_without_a_graph_capture_is_one_line():
    r = CliRunner().invoke(app, ["calibrate", str(fx("llama8b_prefill_b1_eager")), "-o", "/tmp/never.json"])
    assert r.exit_code == 2 and "replays a CUDA graph" in r.stderr


@settings(max_examples=60, deadline=None)
@given(launches=st.integers(0, 20), host=st.floats(0, 5e6), floor=st.floats(0, 5e7), busy=st.floats(0, 1e5),
       kernels=st.integers(0, 5000), memops=st.integers(0, 100), extra=st.floats(0, 1e6))
def test_graph_step_numbers_and_frames_agree_and_grow_with_the_work(launches, host, floor, busy, kernels, memops,
                                                                     extra):
    """One function for a step's numbers and for a frame of steps; more device work never makes it
    shorter, and it is never shorter than either path."""
    import polars as pl

    from stepscope.analysis.whatif import graph_paths

    for c in (*bundled().spread("vllm"), bundled().point("torch")):
        figs = (launches, host, floor, busy, kernels, memops)
        n = graph_step(*figs, c)
        frame = pl.DataFrame([dict(zip(FIGURES, figs))], schema={k: pl.Float64 for k in FIGURES})
        e = frame.select(graph_step(*[pl.col(k) for k in FIGURES], c)).item()
        assert e == pytest.approx(n, rel=1e-12, abs=1e-6)
        assert graph_step(launches, host, floor + extra, busy, kernels, memops, c) >= n
        h, g = graph_paths(*figs, c)
        assert n >= g and (h is None or n >= h)
