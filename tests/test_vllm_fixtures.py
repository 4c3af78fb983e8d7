"""Real vLLM 0.26 steps (fixtures/vllm, H200): steps, phases, kernels and launches against plain
SQL over the same files, the classes of vLLM's kernels, the what-if, the engine-step anatomy."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from stepscope.analysis.diagnosis import diagnose
from stepscope.api import open_trace
from stepscope.render.sections import step_sections

VLLM = Path(__file__).resolve().parent.parent / "fixtures" / "vllm"
NAMES = ["llama8b_decode_b1", "llama8b_decode_b8", "llama8b_prefill_b1", "qwen7b_decode_b1"]
CASES = [f"{n}_{m}" for n in NAMES for m in ("eager", "graph")]
NAME = "coalesce(n.text, (SELECT value FROM StringIds WHERE id = n.textId))"
LAUNCH = ("cudaLaunch%", "cuLaunch%", "cudaGraphLaunch%", "cuGraphLaunch%")


def sql_window(con) -> tuple[int, int, int]:
    """(start, end, globalTid) of the vLLM step: its execute_context range, to the start of the
    next schedule:/execute_context range on the same thread (plain SQL, not stepscope)."""
    rs, gt, rend = con.execute(
        f"SELECT n.start, n.globalTid, n.end FROM NVTX_EVENTS n WHERE {NAME} LIKE 'execute_context%'").fetchone()
    nxt = con.execute(
        f"SELECT min(n.start) FROM NVTX_EVENTS n WHERE n.globalTid = ? AND n.start >= ? AND "
        f"({NAME} LIKE 'schedule:%' OR {NAME} LIKE 'execute_context%')", (gt, rend)).fetchone()[0]
    return rs, nxt, gt


def sql_counts(path: Path) -> dict:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rs, re_, gt = sql_window(con)
    like = " OR ".join(f"s.value LIKE '{p}'" for p in LAUNCH)
    launches = con.execute(
        f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME a JOIN StringIds s ON s.id = a.nameId "
        f"WHERE a.globalTid = ? AND a.start >= ? AND a.start <= ? AND ({like})", (gt, rs, re_)).fetchone()[0]
    kernels = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME a "
        "ON a.correlationId = k.correlationId AND (a.globalTid >> 24) = (k.globalPid >> 24) "
        "WHERE a.globalTid = ? AND a.start >= ? AND a.start <= ?", (gt, rs, re_)).fetchone()[0]
    all_kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    lm_head = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId "
        "AND (a.globalTid >> 24) = (k.globalPid >> 24) "
        "WHERE a.globalTid = ? AND a.start > (SELECT n.end FROM NVTX_EVENTS n WHERE "
        f"{NAME} LIKE 'execute_context%') AND a.start <= ? AND s.value LIKE 'nvjet%'", (gt, re_)).fetchone()[0]
    return {"launches": launches, "kernels": kernels, "all_kernels": all_kernels, "lm_head": lm_head}


@pytest.fixture(scope="module")
def analyzed():
    out = {}
    for c in CASES:
        inv = open_trace(VLLM / f"{c}.sqlite").inventory
        out[c] = (inv, diagnose(inv))
    return out


@pytest.mark.parametrize("case", CASES)
def test_one_step_with_its_phase_kernels_and_launches(analyzed, case):
    inv, _ = analyzed[case]
    ref = sql_counts(VLLM / f"{case}.sqlite")
    assert inv.steps.height == 1
    s = inv.steps.row(0, named=True)
    assert s["delimiter"] == "nvtx" and s["name"].startswith("execute_context_")
    assert s["phase"] == ("prefill" if "prefill" in case else "decode")
    assert s["n_kernels"] == ref["kernels"] == ref["all_kernels"]  # every kernel of the capture
    assert s["n_launch_calls"] == ref["launches"]
    # the LM head is launched by sample_tokens after the execute_context range closes
    assert ref["lm_head"] == 1
    inv.self_check()


@pytest.mark.parametrize("case", CASES)
def test_classes_of_vllm_kernels(analyzed, case):
    inv, _ = analyzed[case]
    c = dict(zip(inv.classes["class"].to_list(), inv.classes["count"].to_list()))
    layers = 28 if case.startswith("qwen") else 32
    assert c["gemm"] == 4 * layers + 1  # qkv, o, gate_up, down per layer + the LM head
    assert c["kv_cache_write"] == layers  # reshape_and_cache_flash_kernel / its fused twin
    assert c["norm"] == 2 * layers + 1
    attention = "attention_prefill" if "prefill" in case else "attention_decode"
    # FA3: one device_kernel per layer; decode adds its split-KV combine per layer and one
    # prepare_varlen_num_blocks_kernel per step
    assert c[attention] == (layers + 1 if "prefill" in case else 2 * layers + 1)
    assert c.get("sampling", 0) >= 1
    k = inv.kernels
    assert k.filter(k["name"] == "_gumbel_sample_kernel")["class"].to_list() == ["sampling"]


@pytest.mark.parametrize("name", ["llama8b_decode_b1", "llama8b_decode_b8"])
def test_what_if_within_ten_percent(analyzed, name):
    """The eager trace alone predicts the graph step within 10 %: vLLM prepares its inputs on the
    host (a prologue of launches before the embedding) under CUDA graphs too."""
    from stepscope.analysis.compare import compare

    (ea, da), (_, db) = analyzed[f"{name}_eager"], analyzed[f"{name}_graph"]
    doc = compare(da, db)
    measured = db.inv.steps["step_time_ns"][0]
    assert doc["prediction_reference_ns"] == measured
    assert abs(doc["prediction_error"]) <= 0.10
    assert doc["prediction_error"] == round((doc["predicted_graph_step_time_ns"] - measured) / measured, 4)


@pytest.mark.parametrize("name", ["llama8b_decode_b1", "llama8b_decode_b8", "qwen7b_decode_b1"])
def test_prologue_against_sql(analyzed, name):
    from stepscope.analysis.whatif import prologue

    inv, _ = analyzed[f"{name}_eager"]
    con = sqlite3.connect(f"file:{VLLM / (name + '_eager.sqlite')}?mode=ro", uri=True)
    rs, re_, gt = sql_window(con)
    emb = con.execute(
        "SELECT a.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId "
        "AND (a.globalTid >> 24) = (k.globalPid >> 24) WHERE s.value LIKE 'indexSelect%'").fetchone()[0]
    n, end = con.execute(
        "SELECT count(*), max(a.end) FROM CUPTI_ACTIVITY_KIND_RUNTIME a WHERE a.globalTid = ? AND a.start >= ? "
        "AND a.start < ? AND a.correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION SELECT correlationId FROM "
        "CUPTI_ACTIVITY_KIND_MEMSET)", (gt, rs, emb)).fetchone()
    p = prologue(inv).row(0, named=True)
    s = inv.steps.row(0, named=True)
    assert p["prologue_launches"] == n  # 10: input preparation kernels and their copies
    assert p["prologue_host_ns"] == end - s["step_begin"]
    assert 1_500_000 < p["prologue_host_ns"] < 3_000_000


def test_trace_json_of_the_capture_is_the_analysis_of_that_moment():
    """What `stepscope trace --engine vllm --mode both --json` printed on the H200: both captures
    analyzed and compared (the what-if then still missed: -28.7 %)."""
    doc = json.loads((VLLM / "llama8b_decode_b1.trace.json").read_text())
    assert [c["mode"] for c in doc["captures"]] == ["eager", "graph"]
    assert all(c["engine"]["vllm"] == "0.26.0" for c in doc["captures"])
    assert doc["compare"]["prediction_error"] == -0.2867


@pytest.mark.parametrize("case", ["llama8b_decode_b1_eager", "llama8b_decode_b1_graph", "qwen7b_decode_b1_eager"])
def test_engine_step_anatomy_against_sql(analyzed, case):
    _, d = analyzed[case]
    e = step_sections(d, 0)["engine"]
    con = sqlite3.connect(f"file:{VLLM / (case + '.sqlite')}?mode=ro", uri=True)
    rs, re_, gt = sql_window(con)
    rend = con.execute(f"SELECT n.end FROM NVTX_EVENTS n WHERE {NAME} LIKE 'execute_context%'").fetchone()[0]
    n_sched, t_sched = con.execute(
        f"SELECT count(*), sum(n.end - n.start) FROM NVTX_EVENTS n WHERE n.globalTid = ? AND n.start >= ? "
        f"AND {NAME} LIKE 'schedule:%'", (gt, re_)).fetchone()
    get_output = con.execute(
        f"SELECT n.end - n.start FROM NVTX_EVENTS n WHERE {NAME} = 'llm_engine step: get_output' "
        "AND n.start < ? AND n.end > ?", (re_, rs)).fetchone()[0]
    assert e["forward_ns"] == rend - rs and e["sample_ns"] == re_ - rend
    assert (e["schedule_ranges"], e["schedule_ns"]) == (n_sched, t_sched) and n_sched == 4
    assert e["get_output_ns"] == get_output and e["engine_ranges"] is True and e["note"] is None


def test_anatomy_says_when_vllm_ranges_are_missing(tmp_path):
    import shutil

    p = tmp_path / "no_scopes.sqlite"
    shutil.copy(VLLM / "llama8b_decode_b1_eager.sqlite", p)
    con = sqlite3.connect(p)
    con.execute(f"DELETE FROM NVTX_EVENTS AS n WHERE {NAME} NOT LIKE 'execute_context%'")
    con.commit()
    con.close()
    inv = open_trace(p).inventory
    e = step_sections(diagnose(inv), 0)["engine"]
    assert e["engine_ranges"] is False and "VLLM_NVTX_SCOPES_FOR_PROFILING=1" in e["note"]
    assert e["schedule_ns"] is None and e["get_output_ns"] is None
    assert inv.steps["n_kernels"][0] == sql_counts(VLLM / "llama8b_decode_b1_eager.sqlite")["all_kernels"]


def test_torch_traces_have_no_engine_section():
    inv = open_trace(VLLM.parent / "llama8b_decode_b1_eager.sqlite").inventory
    assert "engine" not in step_sections(diagnose(inv), 0)
