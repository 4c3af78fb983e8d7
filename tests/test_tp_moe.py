"""`stepscope tp` of an MoE step (fixtures/models/qwen3-30b-a3b, vLLM 0.26 on the H200): the
expert GEMMs are sharded (TP splits each expert's intermediate dimension, vLLM's default without
expert parallelism), the routing is not, and the output says what it assumes. The expert GEMMs'
time is counted again in plain SQL over the projected step's GPU span."""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest

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
    assert "tp --expert-parallel --model M projects that" in note


def test_a_dense_step_has_no_moe_figures():
    from stepscope import library

    doc = library.tp(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    assert "moe_gemm_ns" not in doc["inputs"] and not any(x.startswith("MoE") for x in doc["notes"])


def test_an_async_graph_runs_projection_reproduces_its_own_step():
    """The Qwen3-MoE run's and the dense serving run's graph replays were launched while the GPU
    still ran the previous step (vLLM's async scheduling): at the trace's own width the projection
    is the replay alone and lands within 2 % of the measured step (it was 25.3 ms for 14.7 ms
    when the wait was taken for the graph launch's lead)."""
    from stepscope import library

    for path in (gunzipped(FIXTURES / "models" / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz"),
                 gunzipped(FIXTURES / "serving" / "llama-3.1-8b_serve_r48_s0_graph.sqlite.gz")):
        doc = library.tp(path)
        own = next(r for r in doc["projection"] if r["tp"] == 1)
        assert abs(own["step_time_ns"] / own["measured_step_time_ns"] - 1) < 0.02, (path.name, own)
        assert any("launched while the GPU still ran the previous step" in n for n in doc["notes"])
        # the launch came before the previous step's last kernel ended: plain SQL over the export
        inv = library.load(path)
        st = inv.steps.sort("step")
        i = st["step"].to_list().index(doc["inputs"]["step"])
        prev, cur = st.row(i - 1, named=True), st.row(i, named=True)
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            # the graph launch between the previous replay's first kernel and this one's
            launch = db.execute(
                "SELECT min(r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                "WHERE s.value LIKE 'cudaGraphLaunch%' AND r.start > ? AND r.start < ?",
                (prev["first_start"], cur["first_start"])).fetchone()[0]
            prev_end = db.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ? AND start >= ? "
                                  "AND start <= ?", (prev["device"], prev["first_start"], prev["last_end"])).fetchone()[0]
        assert launch < prev_end


def test_expert_parallel_projects_the_busiest_gpus_experts():
    """`tp --expert-parallel --model qwen3-30b-a3b`: the expert GEMMs take the busiest GPU's share
    of the reached experts instead of 1/w; that share checked against a simulation of uniform
    routing (each token's 8 distinct experts drawn at random), and the projection's rows differ
    from the TP ones by exactly the expert time times (share − 1/w)."""
    import numpy as np

    from stepscope import library
    from stepscope.errors import InputError

    path = gunzipped(FIXTURES / "models" / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz")
    tp, ep = library.tp(path), library.tp(path, expert_parallel=True, model="qwen3-30b-a3b")
    inp = ep["inputs"]
    tokens = library.load(path).steps.filter(pl.col("step") == inp["step"])["tokens"][0]
    assert tokens == 24 and inp["expert_parallel_ns"] == tp["inputs"]["moe_gemm_ns"]
    rng = np.random.default_rng(0)
    trials = 4000
    reached = np.zeros((trials, 128), bool)
    for t in range(tokens):
        picks = np.argsort(rng.random((trials, 128)), axis=1)[:, :8]
        np.put_along_axis(reached, picks, True, axis=1)
    for w in (2, 4, 8):
        per_gpu = reached.reshape(trials, w, 128 // w).sum(axis=2)
        simulated = per_gpu.max(axis=1).mean() / reached.sum(axis=1).mean()
        share = inp["ep_share_by_width"][str(w)]
        assert abs(share / simulated - 1) < 0.03, (w, share, simulated)
        assert share > 1 / w
        d_ep = next(r for r in ep["projection"] if r["tp"] == w)["device_floor_ns"]
        d_tp = next(r for r in tp["projection"] if r["tp"] == w)["device_floor_ns"]
        assert abs(d_ep - d_tp - inp["scale"] * inp["expert_parallel_ns"] * (share - 1 / w)) <= 2
    assert ep["projection"][0]["step_time_ns"] == tp["projection"][0]["step_time_ns"]  # TP=1: the same
    assert any("experts split across the GPUs whole" in n and "24 token(s)" in n for n in ep["notes"])
    for kw, words in (({"expert_parallel": True}, "--expert-parallel needs --model"),
                      ({"expert_parallel": True, "model": "llama-3.1-8b"}, "llama-3.1-8b has no experts"),
                      ({"model": "qwen3-30b-a3b"}, "--model is read by tp with --expert-parallel only")):
        with pytest.raises(InputError, match=words):
            library.tp(path, **kw)
