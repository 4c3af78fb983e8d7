"""The minimum bytes of MoE and MLA steps: the weights of the distinct experts the step's tokens
reach (expected under uniform routing), the shared experts, MLA's compressed KV cache — each
figure written out here by hand from the model's published shape, not from minbytes."""

from __future__ import annotations

import json

import pytest

from stepscope.bytes import minbytes as mb
from stepscope.capture.models import CARDS_DIR

B = 2  # bf16


def _cfg(name):
    return json.loads((CARDS_DIR / f"{name}.json").read_text())


def _rows(card, batch, context, phase):
    return {r["op"]: r for r in mb.step_rows(card, batch, context, phase)}


def test_distinct_experts_at_one_token_and_many():
    from stepscope.analysis.moe import expected_distinct_experts as d

    assert d(128, 8, 1) == pytest.approx(8)          # one token: its own k experts
    assert d(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))  # 15.5: two tokens share some
    assert d(64, 6, 10_000) == pytest.approx(64)      # a long prefill reaches every expert
    assert d(8, 2, 3) == pytest.approx(8 - 8 * 0.75 ** 3)


def test_qwen3_moe_decode_reads_the_experts_its_tokens_reach():
    # Qwen3-30B-A3B: hidden 2048, 128 experts of 768, top 8, 48 MoE layers; decode of 32 sequences
    rows = _rows("qwen3-30b-a3b", 32, 1024, "decode")
    t, h, E, k, I = 32, 2048, 128, 8, 768
    distinct = E * (1 - (1 - k / E) ** t)   # 111.8 of 128
    assert 111 < distinct < 112
    gate_up = t * h * B + round(distinct * h * 2 * I * B) + t * k * 2 * I * B
    down = t * k * I * B + round(distinct * I * h * B) + t * k * h * B
    assert rows["moe_gemm:gate_up"]["min_bytes_per_call"] == gate_up
    assert rows["moe_gemm:down"]["min_bytes_per_call"] == down
    assert rows["moe_gemm:gate_up"]["calls"] == 48 and rows["moe_gemm:gate_up"]["class"] == "moe_gemm"
    assert rows["gemm:router"]["min_bytes_per_call"] == t * h * B + h * E * B + t * E * B
    assert rows["moe_sum"]["min_bytes_per_call"] == t * k * h * B + t * h * B
    # neither one dense MLP (the card's intermediate_size 6144) nor every expert
    assert "gemm:gate_up" not in rows and "gemm:down" not in rows
    all_experts = 48 * E * 3 * h * I * B
    expert_weights = 48 * round(distinct * h * 2 * I * B) + 48 * round(distinct * I * h * B)
    moe = rows["moe_gemm:gate_up"]["min_bytes"] + rows["moe_gemm:down"]["min_bytes"]
    assert moe - expert_weights == 48 * (t * h + t * k * 2 * I + t * k * I + t * k * h) * B
    assert expert_weights < all_experts
    # GQA attention and its KV cache as a dense model's: 4 KV heads of 128, K and V
    assert rows["attn_decode"]["min_bytes_per_call"] == t * 32 * 128 * B * 2 + t * 1024 * 2 * 4 * 128 * B


def test_one_token_reads_exactly_top_k_experts():
    rows = _rows("mixtral-8x7b", 1, 2048, "decode")
    h, I = 4096, 14336
    assert rows["moe_gemm:gate_up"]["min_bytes_per_call"] == h * B + 2 * h * 2 * I * B + 2 * 2 * I * B
    # Mixtral's every layer is MoE: no dense MLP row at all
    assert rows["moe_gemm:down"]["calls"] == 32 and "gemm:gate_up" not in rows


def test_deepseek_mla_and_shared_experts():
    # DeepSeek-V2-Lite: MLA (kv_lora 512, rope 64, 16 heads of nope 128 / v 128, no q LoRA),
    # 64 routed experts of 1408 top 6 + 2 shared, layer 0 dense (10944)
    c = _cfg("deepseek-v2-lite")
    b, ctx = 4, 1024
    rows = _rows("deepseek-v2-lite", b, ctx, "decode")
    cache = c["kv_lora_rank"] + c["qk_rope_head_dim"]  # 576 elements per token and layer
    # decode attention reads the compressed cache once: 576 elements a token, not 2·16·128
    assert rows["mla_decode"]["min_bytes_per_call"] == (b * 16 * cache + b * ctx * cache + b * 16 * 512) * B
    assert rows["mla_kv_write"]["min_bytes_per_call"] == 2 * b * cache * B
    assert rows["mla_decode"]["calls"] == 27 and "attn_decode" not in rows
    assert rows["gemm:kv_a"]["min_bytes_per_call"] == (b * 2048 + 2048 * cache + b * cache) * B
    assert rows["gemm:kv_b"]["min_bytes_per_call"] == (b * 512 + 512 * 16 * 256 + b * 16 * 256) * B
    assert rows["gemm:q"]["min_bytes_per_call"] == (b * 2048 + 2048 * 16 * 192 + b * 16 * 192) * B
    assert rows["gemm:o"]["min_bytes_per_call"] == (b * 16 * 128 + 16 * 128 * 2048 + b * 2048) * B
    # the dense first layer, then 26 MoE layers with the shared experts (2 × 1408 wide) dense over the tokens
    assert rows["gemm:gate_up"]["calls"] == 1 and rows["gemm:gate_up"]["min_bytes_per_call"] == (
        b * 2048 + 2048 * 2 * 10944 + b * 2 * 10944) * B
    assert rows["gemm:shared_gate_up"]["calls"] == 26
    assert rows["gemm:shared_gate_up"]["min_bytes_per_call"] == (b * 2048 + 2048 * 2 * 2816 + b * 2 * 2816) * B
    distinct = 64 * (1 - (1 - 6 / 64) ** b)  # 20.8
    assert rows["moe_gemm:down"]["min_bytes_per_call"] == (
        (b * 6 * 1408 + b * 6 * 2048) * B + round(distinct * 1408 * 2048 * B))
    # the step's weights: all but the unreached experts (and the input embedding's other rows)
    total = sum(r["min_bytes"] for r in rows.values())
    assert total == mb.step_min_bytes("deepseek-v2-lite", b, ctx, "decode")


def test_a_long_prefill_reaches_every_expert():
    rows = _rows("deepseek-v2-lite", 1, 2048, "prefill")
    assert rows["moe_gemm:gate_up"]["min_bytes_per_call"] == pytest.approx(
        2048 * 2048 * B + 64 * 2048 * 2 * 1408 * B + 2048 * 6 * 2 * 1408 * B, rel=1e-9)
    # MLA prefill: K and V expanded from the latent, attention over them
    assert rows["mla_prefill"]["min_bytes_per_call"] == 2048 * (2 * 16 * 192 + 16 * 128) * B + 2048 * 16 * 128 * B


def test_the_assumption_is_stated():
    note = mb.moe_note("qwen3-30b-a3b", 32, 1024, "decode")
    assert "111.8 of 128 per MoE layer (top-8) in 48 MoE layer(s)" in note
    assert "uniform routing" in note and "E·(1−(1−k/E)^T)" in note
    assert "and 1 dense, plus the shared experts" in mb.moe_note("deepseek-v2-lite", 4, 1024, "decode")
    assert mb.moe_note("llama-3.1-8b", 1, 2048, "decode") is None
    # a dense model's plan is unchanged: the seed's 15.29 GB decode step
    assert mb.step_min_bytes("llama-3.1-8b", 1, 2048, "decode") == 15_289_851_408


def test_budget_of_an_moe_step_carries_the_note():
    import polars as pl

    from stepscope.bytes.budget import budget

    kernels = pl.DataFrame({"name": ["fused_moe_kernel"], "demangled": ["fused_moe_kernel"], "class": ["moe_gemm"],
                            "grid_x": [1], "grid_y": [1], "grid_z": [1], "block_x": [128], "block_y": [1],
                            "block_z": [1], "count": [96], "time_ns": [1000]})
    cells = pl.DataFrame({"cell": ["x"], "op": ["embedding"], "proj": [None], "tokens": [1], "kernel": ["k"],
                          "grid_x": [1], "grid_y": [1], "grid_z": [1], "block_x": [1], "block_y": [1], "block_z": [1],
                          "dram_read_bytes": [1], "dram_write_bytes": [1], "gpu": ["NVIDIA H200"]},
                         schema_overrides={"proj": pl.String})
    res = budget(kernels, cells, "qwen3-30b-a3b", 32, 1024, "decode", "NVIDIA H200")
    d = res.to_dict()
    assert any("uniform routing" in n for n in d["notes"])
    moe = {r["op"]: r for r in d["rows"]}
    assert moe["moe_gemm:gate_up"]["plan_min_bytes"] == _rows("qwen3-30b-a3b", 32, 1024, "decode")[
        "moe_gemm:gate_up"]["min_bytes"]
    dense = budget(kernels.with_columns(pl.lit("gemm").alias("class")), cells, "llama-3.1-8b", 1, 2048, "decode",
                   "NVIDIA H200").to_dict()
    assert "notes" not in dense


def test_the_sweep_and_the_torch_engine_refuse_moe_and_mla_models():
    from tests.conftest import CliRunner

    from stepscope.cli import app

    r = CliRunner().invoke(app, ["cells", "run", "--model", "qwen3-30b-a3b", "--print-commands"])
    assert r.exit_code == 2 and "qwen3-30b-a3b is a mixture of experts: the sweep measures a dense layer's ops" \
        in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["cells", "run", "--model", "deepseek-v2-lite", "--engine", "torch",
                                 "--print-commands"])
    assert r.exit_code == 2 and "deepseek-v2-lite is a mixture of experts: use --engine vllm" in r.output
    r = CliRunner().invoke(app, ["cells", "run", "--model", "qwen3-30b-a3b", "--engine", "vllm", "--print-commands"])
    assert r.exit_code == 0 and "--model qwen3-30b-a3b" in r.output


# --- against the real runs: the expert GEMMs' time beside their bandwidth floor -------------------

def _moe_gemm_time(fixture: str):
    """Per step of a fixtures/models run: (tokens, phase, the fused_moe_kernel time in plain SQL
    over the step's GPU span) and the GPU's peak bandwidth as the export records it."""
    import sqlite3

    from conftest import FIXTURES, gunzipped
    from stepscope import library

    path = gunzipped(FIXTURES / "models" / f"{fixture}.sqlite.gz")
    st = library.load(path).steps.sort("step")
    out = []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        peak = db.execute("SELECT memoryBandwidth FROM TARGET_INFO_GPU").fetchone()[0]
        for r in st.iter_rows(named=True):
            ns = db.execute("SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
                            "s.id = k.shortName WHERE s.value = 'fused_moe_kernel' AND k.deviceId = ? AND "
                            "k.start >= ? AND k.start <= ?", (r["device"], r["first_start"], r["last_end"])).fetchone()[0]
            out.append((r["tokens"], r["phase"], ns))
    return out, peak


def _expert_weights(t, E, k, h, inter, layers):
    """The bytes of the experts T tokens reach in every MoE layer, uniform routing (by hand)."""
    return layers * E * (1 - (1 - k / E) ** t) * 3 * h * inter * B


def test_qwen3_expert_gemms_sit_above_their_floor_and_far_below_all_experts():
    """Qwen3-30B-A3B's decode steps (2–32 tokens: the batch as its replayed CUDA graph pads it):
    the expert GEMMs take longer than the distinct experts' weights need at peak bandwidth, and
    less than every expert's weights would: the minimum is the reached experts, not all 128."""
    steps, peak = _moe_gemm_time("qwen3-30b-a3b_r32_graph_plain")
    decode = [(t, ns) for t, phase, ns in steps if phase == "decode" and t <= 32]
    assert len(decode) >= 50 and {2, 4, 8, 16, 24, 32} <= {t for t, _ in decode}
    for t, ns in decode:
        floor_ns = _expert_weights(t, 128, 8, 2048, 768, 48) / peak * 1e9
        assert floor_ns < ns, (t, ns, floor_ns)
        rows = _rows("qwen3-30b-a3b", t, 1024, "decode")
        assert rows["moe_gemm:gate_up"]["min_bytes"] + rows["moe_gemm:down"]["min_bytes"] >= \
            _expert_weights(t, 128, 8, 2048, 768, 48) - 48 * 2  # (each layer's two products rounded)
    all_experts_ns = 48 * 128 * 3 * 2048 * 768 * B / peak * 1e9  # 12.0 ms
    assert all(ns < all_experts_ns for t, ns in decode if t <= 8)


def test_deepseek_dummy_router_is_skewed_and_the_note_says_what_that_means():
    """DeepSeek-V2-Lite's dummy-weight router sends the tokens of a step to about the same experts:
    its 4–32-token decode steps run their expert GEMMs in about the time of one token's (0.9–1.3
    ms), under the floor of the experts uniform routing would reach, above the floor of k experts."""
    steps, peak = _moe_gemm_time("deepseek-v2-lite_r32_graph_plain")
    decode = [(t, ns) for t, phase, ns in steps if phase == "decode" and 4 <= t <= 32]
    assert len(decode) >= 30
    for t, ns in decode:
        assert ns < _expert_weights(t, 64, 6, 2048, 1408, 26) / peak * 1e9
        assert ns > _expert_weights(1, 64, 6, 2048, 1408, 26) / peak * 1e9
    note = mb.moe_note("deepseek-v2-lite", 16, 1, "decode")
    assert "measured below this minimum then means routing" in note
    assert "the least any routing reads is 6 experts' weights a layer (2.70 GB)" in note
    assert f"{6 * 3 * 2048 * 1408 * B * 26 / 1e9:.2f} GB" == "2.70 GB"


def test_launch_order_budget_names_an_moe_layers_ops():
    """The launch-order join (`cells run --engine vllm` then `budget`) on a real Qwen3-MoE decode
    step (16 sequences): with the MoE classes (given here by kernel name, as the classification
    table gives them), each layer's routing kernels take moe_topk, moe_align, moe_sum, its
    act_and_mul the experts' activation, and each class its plan's minimum. The cells are the
    step's own kernels in order (what the step's ncu run records), their bytes zero: the ops, not
    the bytes, are under test."""
    import polars as pl

    from conftest import FIXTURES, gunzipped
    from stepscope import library
    from stepscope.bytes.budget import budget_order, step_sequence_from_inventory

    inv = library.load(gunzipped(FIXTURES / "models" / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz"))
    step = inv.steps.filter((pl.col("tokens") == 16) & (pl.col("graph_mode") == "full"))["step"][0]
    seq = step_sequence_from_inventory(inv, step)
    name = pl.col("name")
    seq = seq.with_columns(pl.when(name == "fused_moe_kernel").then(pl.lit("moe_gemm"))
                           .when(name.is_in(["topkGating", "moe_align_block_size_kernel",
                                             "count_and_sort_expert_tokens_kernel", "moe_sum_vec_kernel"]))
                           .then(pl.lit("moe_routing")).otherwise(pl.col("class")).alias("class"))
    n = seq.height
    cells = pl.DataFrame({"cell": [f"k{i}" for i in range(n)], "op": [None] * n, "proj": [None] * n,
                          "tokens": [16] * n, "launch": list(range(n)), "kernel": seq["name"].to_list(),
                          "dram_read_bytes": [0] * n, "dram_write_bytes": [0] * n, "gpu": ["NVIDIA H200"] * n},
                         schema_overrides={"op": pl.String, "proj": pl.String})
    res = budget_order(seq, cells, "qwen3-30b-a3b", 16, 1024, "decode", "NVIDIA H200")
    k = res.kernels
    routing = ["topkGating", "moe_align_block_size_kernel", "count_and_sort_expert_tokens_kernel",
               "moe_sum_vec_kernel", "act_and_mul_kernel"]
    ops = {r["name"]: sorted(r["op"]) for r in k.filter(pl.col("name").is_in(routing))
           .group_by("name").agg(pl.col("op").unique()).iter_rows(named=True)}
    assert ops == {
        "topkGating": ["moe_topk"], "moe_align_block_size_kernel": ["moe_align"],
        "count_and_sort_expert_tokens_kernel": ["moe_align"], "moe_sum_vec_kernel": ["moe_sum"],
        "act_and_mul_kernel": ["moe_act"]}
    assert k.filter(pl.col("name") == "fused_moe_kernel")["op"].str.starts_with("moe_gemm:").all()
    assert k.filter(pl.col("name") == "act_and_mul_kernel").height == 48
    assert any("uniform routing" in x for x in res.notes)
