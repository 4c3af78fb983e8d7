"""`stepscope tp` of an MoE step (fixtures/models/qwen3-30b-a3b, vLLM 0.26 on the H200): the
expert GEMMs are sharded (TP splits each expert's intermediate dimension, vLLM's default without
expert parallelism), the routing is not, and the output says what it assumes. The expert GEMMs'
time is counted again in plain SQL over the projected step's GPU span."""

from __future__ import annotations

import sqlite3

import polars as pl

from conftest import FIXTURES, gunzipped


def test_tp_shards_the_expert_gemms_and_says_what_it_assumes():
    from stepscope import library

    path = gunzipped(FIXTURES / "models" / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz")
    doc = library.tp(path)
    inp = doc["inputs"]
    inv = library.load(path)
    st = inv.steps.filter(pl.col("step") == inp["step"]).row(0, named=True)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        moe_ns, n = db.execute(
            "SELECT sum(k.end - k.start), count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            "ON s.id = k.shortName WHERE s.value = 'fused_moe_kernel' AND k.deviceId = ? AND k.start >= ? "
            "AND k.start <= ?", (st["device"], st["first_start"], st["last_end"])).fetchone()
    assert n == 96  # 48 layers × gate_up and down
    assert inp["moe_gemm_ns"] == moe_ns
    # the expert GEMMs are in the sharded time, beside the dense GEMMs and attention
    c = inv.classes.filter(pl.col("step") == inp["step"])
    dense = c.filter(pl.col("class").is_in(["gemm", "splitk_reduce", "attention_prefill", "attention_decode"]))
    assert inp["sharded_ns"] == dense["time_ns"].sum() + moe_ns
    assert inp["sharded_ns"] + inp["unsharded_ns"] == c.filter(pl.col("class") != "comm")["time_ns"].sum()
    assert 0 < inp["moe_routing_ns"] < inp["unsharded_ns"]
    note = next(x for x in doc["notes"] if x.startswith("MoE step"))
    assert "each expert's intermediate dimension (vLLM's default, without --enable-expert-parallel)" in note
    assert "with --enable-expert-parallel the experts split across the GPUs" in note
    assert "which this projection does not model" in note


def test_a_dense_step_has_no_moe_figures():
    from stepscope import library

    doc = library.tp(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    assert "moe_gemm_ns" not in doc["inputs"] and not any(x.startswith("MoE") for x in doc["notes"])
