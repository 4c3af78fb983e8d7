"""The kernel classes of the models people serve (MoE, FP8, MLA) and of a real `vllm serve`, on the
round-nine H200 captures (fixtures/models, fixtures/vllm_serve): the kernels of each class by
name against plain SQL over the same file, `other` at most 1 % of GPU time over the steps and
over every kernel of the file, the router's top-k told from the sampler's by its place, and
Inductor's fused quantization reductions never GEMMs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest

from stepscope.api import open_trace
from tests.conftest import FIXTURES, gunzipped

MODELS = {"qwen3": "models/qwen3-30b-a3b_r32_graph_plain", "deepseek": "models/deepseek-v2-lite_r32_graph_plain",
          "fp8": "models/llama-3.1-8b-fp8_r32_graph_plain",
          # tenth round: the eager MoE run of `stepscope trace` (profiler hooks), and long prompts
          "qwen3_eager": "models/qwen3-30b-a3b_serve_r16_s0_eager",
          "long_graph": "models/llama-3.2-1b_r16_long_graph_plain",
          "long_node": "models/llama-3.2-1b_r16_long_node_plain"}
SERVE = {f"serve_{m}": f"vllm_serve/llama-3.1-8b_serve_{m}" for m in ("hooks", "sigint", "flush")}
ALL = {**MODELS, **SERVE}
KEY = ["start", "device", "stream"]

_CACHE: dict[str, tuple] = {}


# the capture stopped with SIGINT holds start-up only: stepscope finds no engine step in it and
# refuses to analyze it (tests/test_capture_defects.py); its kernels are classed by name here
NO_STEP = {"serve_sigint"}


def analyzed(case: str):
    """(inventory, path of the unpacked export) of a fixture, once per test process."""
    if case not in _CACHE:
        path = gunzipped(FIXTURES / f"{ALL[case]}.sqlite.gz")
        _CACHE[case] = (open_trace(path).inventory, path)
    return _CACHE[case]


def by_name(case: str) -> pl.DataFrame:
    """Every kernel of the file in SQL with the class its names get from the rules alone."""
    from stepscope.analysis.classify import classify_names, load_rules

    sql = sql_kernels(gunzipped(FIXTURES / f"{ALL[case]}.sqlite.gz"))
    names = sql.select(pl.col("short").alias("name"), pl.col("dem").alias("demangled")).unique()
    return sql.join(classify_names(names, load_rules()), left_on=["short", "dem"],
                    right_on=["name", "demangled"], how="left", nulls_equal=True)


def test_the_sigint_capture_is_refused_and_its_kernels_classed_by_name():
    from stepscope.errors import InputError

    with pytest.raises(InputError, match="no engine step found"):
        analyzed("serve_sigint")
    k = by_name("serve_sigint")
    assert k.height == sql_kernels(gunzipped(FIXTURES / f"{ALL['serve_sigint']}.sqlite.gz")).height
    assert k.filter(pl.col("class") == "other")["dur"].sum() <= 0.01 * k["dur"].sum()
    topk = k.filter(pl.col("short").is_in(["gatherTopK", "bitonicSortKVInPlace"]))
    assert (topk["class"] == "sampling").all()
    assert (k.filter(pl.col("dem").str.contains("ArgMaxOps"))["class"] == "sampling").all()


def sql_kernels(path: Path) -> pl.DataFrame:
    """Every kernel of the file in plain SQL: start, device, stream, duration, short and demangled name."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT k.start, k.deviceId, k.streamId, k.end - k.start, s.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName JOIN StringIds d ON d.id = k.demangledName").fetchall()
    return pl.DataFrame(rows, schema={"start": pl.Int64, "device": pl.Int64, "stream": pl.Int64, "dur": pl.Int64,
                                      "short": pl.String, "dem": pl.String}, orient="row")


def classed(inv, steps_only: bool) -> pl.DataFrame:
    """The analysis's kernels (key, step, class), every kernel of the file or those of its steps
    (whole-graph replays, a graph-level capture's rows of CUPTI_ACTIVITY_KIND_GRAPH_TRACE, left
    out: SQL's kernel table does not hold them; test_graph_replays_are_their_own_class counts them)."""
    a = inv.acts.filter(pl.col("is_kernel") & (pl.col("class").cast(pl.String) != "cuda_graph"))
    if steps_only:
        a = a.filter(pl.col("step").is_not_null())
    return a.select(pl.col("start").cast(pl.Int64), pl.col("device").cast(pl.Int64), pl.col("stream").cast(pl.Int64),
                    "step", pl.col("class").cast(pl.String))


def joined(case: str, steps_only: bool = True) -> pl.DataFrame:
    """The analysis's class beside SQL's names, kernel by kernel (every analysed kernel is in the file)."""
    inv, path = analyzed(case)
    mine = classed(inv, steps_only)
    out = mine.join(sql_kernels(path), on=KEY, how="inner")
    assert out.height == mine.height
    return out


@pytest.mark.parametrize("case", sorted(set(ALL) - NO_STEP))
def test_other_holds_at_most_one_percent(case):
    inv, path = analyzed(case)
    sql = sql_kernels(path)
    every = classed(inv, False)
    assert every.height == sql.height  # every kernel of the file has a class
    allk = every.join(sql, on=KEY)
    total = sql["dur"].sum()
    other = allk.filter(pl.col("class") == "other")["dur"].sum()
    assert other <= 0.01 * total
    steps = allk.filter(pl.col("step").is_not_null())
    if steps.height:
        assert steps.filter(pl.col("class") == "other")["dur"].sum() <= 0.01 * steps["dur"].sum()
    # and the step tables say the same as the kernels do
    k = inv.kernels
    assert k.filter(pl.col("class") == "other")["time_ns"].sum() <= 0.01 * max(k["time_ns"].sum(), 1)


@pytest.mark.parametrize("case", ["qwen3", "qwen3_eager", "deepseek"])
def test_the_experts_gemms_are_fused_moe_kernel(case):
    for steps_only in (True, False):
        j = joined(case, steps_only)
        fused = j.filter(pl.col("short") == "fused_moe_kernel")
        moe = j.filter(pl.col("class") == "moe_gemm")
        assert fused.height > 1000 and moe.height == fused.height
        assert moe["dur"].sum() == fused["dur"].sum()
        assert (fused["class"] == "moe_gemm").all()
    # the first screen's share: the experts' GEMMs, not `other`, hold the MoE step's time
    inv, _ = analyzed(case)
    by = inv.kernels.group_by("class").agg(pl.col("time_ns").sum())
    share = dict(zip(by["class"].cast(pl.String), by["time_ns"]))
    assert share["moe_gemm"] > 0.3 * sum(share.values())


ROUTING_NAMES = ("topkGating", "moe_align_block_size_kernel", "moe_align_block_size_small_batch_expert_kernel",
                 "count_and_sort_expert_tokens_kernel", "moe_sum_vec_kernel")


@pytest.mark.parametrize("case", ["qwen3", "qwen3_eager", "deepseek"])
def test_routing_kernels_by_name(case):
    j = joined(case)
    named = j.filter(pl.col("short").is_in(ROUTING_NAMES))
    assert named.height > 1000 and (named["class"] == "moe_routing").all()
    # per name: SQL's count of the steps' kernels of that name is the analysis's routing count
    sql = named.group_by("short").len().sort("short")
    ana = j.filter(pl.col("class") == "moe_routing").group_by("short").len().sort("short")
    assert sql.join(ana, on="short", how="left")["len_right"].to_list() == sql["len"].to_list()
    if case.startswith("qwen3"):  # topkGating routes: no router top-k is left to sampling
        assert set(ana["short"]) == set(sql["short"])
        assert set(j.filter(pl.col("class") == "sampling")["short"]) == {"reduce_kernel"}


def next_on_stream(sql: pl.DataFrame) -> pl.DataFrame:
    """Each kernel with the name of the next kernel on its stream that is no top-k and no glue
    (an Inductor or ATen elementwise kernel: the top-k weights' scaling), in plain SQL's names
    ordered by start, to tell the router's top-k by place."""
    s = sql.sort("device", "stream", "start").with_columns(
        skip=pl.col("short").is_in(["gatherTopK"]) | pl.col("short").str.starts_with("triton_")
        | pl.col("short").str.contains("elementwise"))
    nxt = pl.when(~pl.col("skip")).then(pl.col("short"))
    return s.with_columns(after=nxt.shift(-1).backward_fill().over("device", "stream"))


def test_the_routers_top_k_is_routing_and_the_samplers_is_sampling():
    """DeepSeek's router calls torch.topk (gatherTopK) over the experts' scores inside every MoE
    layer, vLLM's sampler over the vocabulary's logits after the LM head: the same kernel name.
    By place in plain SQL: the router's is followed on its stream by the experts' token sort or
    their GEMM."""
    inv, path = analyzed("deepseek")
    sql = next_on_stream(sql_kernels(path))
    topk = classed(inv, False).join(sql, on=KEY).filter(pl.col("short") == "gatherTopK")
    experts = pl.col("after").str.starts_with("moe_align_block_size") | (pl.col("after") == "fused_moe_kernel")
    router, sampler = topk.filter(experts), topk.filter(~experts)
    assert router.height > 3000 and (router["class"] == "moe_routing").all()
    assert sampler.height >= 1 and (sampler["class"] == "sampling").all()
    # the shape agrees: torch's multi-block top-k is the one over vocabulary-sized rows
    assert sampler["dem"].str.contains("mbtopk").all() and not router["dem"].str.contains("mbtopk").any()
    # in the steps, every gatherTopK is the router's (2 per MoE layer)
    steps = topk.filter(pl.col("step").is_not_null())
    assert steps.height == router.filter(pl.col("step").is_not_null()).height
    assert set(inv.kernels.filter(pl.col("name") == "gatherTopK")["class"].cast(pl.String)) == {"moe_routing"}
    by = inv.class_by.filter(pl.col("name") == "gatherTopK")
    assert by.height and by["class_by"].str.contains("not after the LM head").all()


@pytest.mark.parametrize("case", ["serve_flush"])
def test_a_dense_models_top_k_stays_sampling(case):
    inv, path = analyzed(case)
    topk = classed(inv, False).join(sql_kernels(path), on=KEY).filter(
        pl.col("short").is_in(["gatherTopK", "bitonicSortKVInPlace"]))
    sql = sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE s.value IN ('gatherTopK', 'bitonicSortKVInPlace')").fetchone()[0]
    assert topk.height == sql
    assert (topk["class"] == "sampling").all()


@pytest.mark.parametrize("case", sorted(set(ALL) - NO_STEP))
def test_the_final_argmax_is_sampling(case):
    j = joined(case)
    argmax = j.filter(pl.col("dem").str.contains("ArgMaxOps"))
    assert (argmax["class"] == "sampling").all()
    # one per step at most (the sampled token of each sequence), in the steps of traffic
    assert argmax.height == argmax["step"].n_unique()
    assert argmax.height > 60


def test_inductors_fused_quantization_is_not_gemm():
    """llama-3.1-8b FP8: Inductor fuses the dynamic per-token quantization of each scaled-mm's input
    (with the add+RMSNorm or the SiLU·mul before it) into a Triton reduction named after the
    scaled-mm; the GEMMs are the CUTLASS scaled-mm kernels and the bf16 LM head."""
    j = joined("fp8")
    fused = j.filter(pl.col("short").str.starts_with("triton_red_fused") & pl.col("short").str.contains("scaled_mm"))
    assert fused.height > 5000 and (fused["class"] == "quantization").all()
    gemm = j.filter(pl.col("class") == "gemm")
    sql_gemm = j.filter(pl.col("dem").str.contains("cutlass_3x_gemm_sm90_fp8") | pl.col("short").str.starts_with("nvjet"))
    assert gemm.height == sql_gemm.height and gemm["dur"].sum() == sql_gemm["dur"].sum()
    # vLLM's own quantization kernels (dynamic per-tensor scale, then the cast) too, over the file
    every = joined("fp8", steps_only=False)
    for name in ("segmented_max_reduction_strided", "scaled_fp8_quant_kernel_strided_dynamic"):
        rows = every.filter(pl.col("short") == name)
        assert rows.height == 128 and (rows["class"] == "quantization").all()
    # the norm fused into them is named with them, so that the tiny norm class is explained
    inv, _ = analyzed("fp8")
    by = inv.class_by.filter(pl.col("class") == "quantization")
    norm = by.filter(pl.col("name").str.contains("rms_norm"))
    silu = by.filter(pl.col("name").str.contains("silu"))
    assert norm.height and norm["class_by"].str.contains("norm fused into it").all()
    assert silu.height and silu["class_by"].str.contains("activation fused into it").all()


def test_mla_attention_and_its_cache_write():
    """DeepSeek-V2-Lite on vLLM's FLASH_ATTN_MLA: FA3 kernels with MLA's head sizes, their combine
    pass, MLA's chunked-context merge and its latent cache write: attention and kv_cache_write."""
    every = joined("deepseek", steps_only=False)
    for name, classes in (("concat_and_cache_mla_kernel", {"kv_cache_write"}),
                          ("merge_attn_states_kernel", {"attention_prefill", "attention_decode"}),
                          ("mask_empty_context_kernel", {"attention_prefill", "attention_decode"})):
        rows = every.filter(pl.col("short") == name)
        assert rows.height and set(rows["class"]) <= classes, name
    fa = every.filter(pl.col("dem").str.contains("flash::"))
    assert fa.height > 3000 and fa["class"].is_in(["attention_prefill", "attention_decode"]).all()


def test_graph_replays_are_their_own_class():
    """The flush capture traced graphs whole: each replay of CUPTI_ACTIVITY_KIND_GRAPH_TRACE is one
    `cuda_graph` activity with the replay's GPU time (plain SQL), and no kernel of the kernel table
    is in that class."""
    inv, path = analyzed("serve_flush")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n, ns = con.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()
    g = inv.acts.filter(pl.col("class").cast(pl.String) == "cuda_graph")
    assert g.height == n == 118 and (g["end"] - g["start"]).sum() == ns
    assert g["name"].unique().to_list() == ["CUDA graph replay (traced whole: --cuda-graph-trace=graph)"]
