"""The fifth H200 round (fixtures/round5, fixtures/vllm): steps, phases and classes that the
trace's names do not give away, each checked against plain SQL over the same export."""

from __future__ import annotations

import polars as pl

from stepscope.api import open_trace
from tests.conftest import FIXTURES, need, ro

R5 = FIXTURES / "round5"
VLLM = FIXTURES / "vllm"


def _count(path, where: str) -> int:
    return ro(path).execute(f"""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                JOIN StringIds s ON s.id = k.shortName WHERE {where}""").fetchone()[0]


def test_compiled_step_has_its_eight_layers():
    """torch.compile numbers its kernels per call site (..._rsqrt_11, _12, _13, _14 for the norms
    of alternating layers): compared without the number, the 8-layer step repeats every layer.
    Hand check: one cuDNN SDPA kernel per layer, and 147 kernels = 8 layers x 18 + the final
    norm, the LM head and the argmax."""
    path = need(R5 / "llama8b_decode_compiled_l8.sqlite")
    s = open_trace(path).steps[0]
    per_layer = _count(path, "s.value LIKE 'cudnn_generated_fort_native_sdpa%'")
    assert s.layers == per_layer == 8
    assert s.kernels_per_layer == 18
    tail = _count(path, "s.value IN ('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_15', "
                        "'nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT', 'triton_red_fused_argmax_16')")
    assert s.n_kernels == s.layers * s.kernels_per_layer + tail == 147


def _three_steps_sql(path):
    """Per step, from SQL alone: the host synchronizations (cudaStreamSynchronize after each
    step's D2H copy of the sampled token) cut the capture; a step's kernels are those whose
    launching call starts before its sync and after the previous one."""
    con = ro(path)
    syncs = con.execute("""SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
                           ON s.id = r.nameId WHERE s.value LIKE 'cudaStreamSynchronize%' ORDER BY r.start""").fetchall()
    edges = [0] + [e for _, e in syncs]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        out.append(con.execute(f"""
            SELECT count(*), sum(CASE WHEN s.value LIKE 'cudnn_generated_fort_native_sdpa%' THEN 1 ELSE 0 END)
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            WHERE r.start > {lo} AND r.start < {hi}""").fetchone())
    d2h = con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2 ORDER BY start").fetchall()
    return syncs, out, d2h


def test_three_decode_steps_in_one_capture_are_three_steps():
    """One cudaProfilerStart/Stop range, no NVTX, three eager decode steps of Llama-3.2-1B, each
    ending with the sampled token's copy to the host and a sync: three steps of 16 layers."""
    path = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    a = open_trace(path)
    s = a.table
    syncs, per_step, d2h = _three_steps_sql(path)
    assert len(syncs) == len(d2h) == s.height == 3
    assert (s["delimiter"] == "sync").all()
    assert s["n_kernels"].to_list() == [n for n, _ in per_step] == [940, 942, 942]
    # each step has the model's 16 layers (one cuDNN SDPA launch per layer, by SQL)
    assert s["layers"].to_list() == [attn for _, attn in per_step] == [16, 16, 16]
    # each step's last GPU activity is its D2H copy of the sampled token
    assert s["last_end"].to_list() == [e for _, e in d2h]
    # the steps partition the capture: every kernel in exactly one step
    assert s["n_kernels"].sum() == ro(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def test_three_decode_steps_without_any_marker_split_the_same_way():
    """The same trace with its profiler start call taken out: a process without markers, whose
    smallest repeat period is a layer (58 kernels); cut into whole steps at its syncs instead."""
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.ingest import read_trace

    path = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    t = read_trace(path, cache=False)
    prof = [i for i, v in t.string_map().items() if v.startswith(("cuProfiler", "cudaProfiler"))]
    t.api = t.api.filter(~pl.col("name_id").is_in(prof))
    s = analyze_trace(t).steps
    _, per_step, _ = _three_steps_sql(path)
    assert (s["delimiter"] == "sync").all()
    assert s["n_kernels"].to_list() == [n for n, _ in per_step]
    assert s.select("layers", "kernels_per_layer").unique().rows() == [(16, 58)]
