"""Theoretical minimum bytes against hand-computed values for Llama-3.1-8B (bf16)."""

import json

import pytest

from stepscope.bytes import minbytes as mb
from stepscope.bytes.hbm import canonical_gpu, peak_hbm_bps, same_gpu
from stepscope.errors import InputError

H, I, V, L = 4096, 14336, 128256, 32
QKV = 4096 + 2 * 1024  # 32 q heads + 2 x 8 kv heads, head_dim 128


@pytest.fixture
def s():
    return mb.shape_of("llama-3.1-8b")


def test_shape(s):
    assert (s.hidden, s.heads, s.kv_heads, s.head_dim, s.elem) == (4096, 32, 8, 128, 2)
    assert s.qkv_dim == 6144
    assert s.proj("qkv") == (4096, 6144)


def test_qkv_weights_and_seed_m2048(s):
    w = 4096 * 6144 * 2
    assert mb.op_min_bytes(s, "gemm", 1, proj="qkv")["read_bytes"] == w + 4096 * 2
    got = mb.op_min_bytes(s, "gemm", 2048, proj="qkv")
    assert got["read_bytes"] == 2048 * 4096 * 2 + w
    assert got["write_bytes"] == 2048 * 6144 * 2
    assert round(got["min_bytes"] / 1e6, 1) == 92.3  # the seed's qkv_m2048 minimum


@pytest.mark.parametrize("proj,k,n", [("o", 4096, 4096), ("gate_up", 4096, 2 * 14336),
                                      ("down", 14336, 4096), ("lm_head", 4096, 128256)])
def test_other_projections(s, proj, k, n):
    m = 64
    got = mb.op_min_bytes(s, "gemm", m, proj=proj)
    assert got == {"read_bytes": (m * k + k * n) * 2, "write_bytes": m * n * 2,
                   "min_bytes": (m * k + k * n + m * n) * 2}


def test_lm_head_decode_is_about_1_05_gb(s):
    assert mb.op_min_bytes(s, "lm_head", 1)["min_bytes"] == (4096 + 4096 * V + V) * 2
    assert round(mb.op_min_bytes(s, "lm_head", 1)["min_bytes"] / 1e9, 2) == 1.05


def test_attention_matches_seed(s):
    dec = mb.op_min_bytes(s, "attn_decode", batch=64, context=2048)
    kv = 64 * 2048 * 2 * 8 * 128 * 2
    assert dec["read_bytes"] == kv + 64 * 4096 * 2
    assert round(dec["min_bytes"] / 1e6, 2) == 537.92
    pre = mb.op_min_bytes(s, "attn_prefill", 2048)
    assert pre["min_bytes"] == 2048 * (4096 + 2048) * 2 + 2048 * 4096 * 2
    assert round(pre["min_bytes"] / 1e6, 1) == 41.9


def test_light_ops(s):
    assert mb.op_min_bytes(s, "norm", 64)["min_bytes"] == (64 * H + H + 64 * H) * 2
    assert mb.op_min_bytes(s, "add_norm", 64)["min_bytes"] == (4 * 64 * H + H) * 2
    assert mb.op_min_bytes(s, "silu_mul", 64)["min_bytes"] == (64 * 2 * I + 64 * I) * 2
    assert mb.op_min_bytes(s, "argmax", 1)["read_bytes"] == V * 4  # 0.51 MB fp32
    assert mb.op_min_bytes(s, "kv_write", 10)["min_bytes"] == 4 * 10 * 1024 * 2
    assert mb.op_min_bytes(s, "embedding", 2)["min_bytes"] == 2 * 8 + 2 * 2 * H * 2


def test_decode_step_reproduces_seed_15_29_gb():
    rows = mb.step_rows("llama-3.1-8b", batch=1, context=2048, phase="decode")
    total = mb.step_min_bytes("llama-3.1-8b", 1, 2048, "decode")
    assert total == sum(r["min_bytes"] for r in rows)  # the total is the sum of its rows
    assert round(total / 1e9, 2) == 15.29
    weights = L * (H * QKV + H * H + H * 2 * I + I * H) * 2 + H * V * 2
    assert weights < total < weights + 0.3e9
    calls = {r["op"]: r["calls"] for r in rows}
    assert calls["gemm:qkv"] == 32 and calls["add_norm"] == 64 and calls["norm"] == 1
    assert calls["gemm:lm_head"] == 1 and calls["argmax"] == 1


def test_prefill_step_counts_lm_head_once_per_sequence():
    rows = {r["op"]: r for r in mb.step_rows("llama-3.1-8b", 2, 1024, "prefill")}
    assert rows["gemm:lm_head"]["tokens"] == 2
    assert rows["gemm:qkv"]["tokens"] == 2048


def test_card_sources(tmp_path):
    cfg = dict(mb.BUILTIN_CARDS["llama-3.1-8b"])
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert mb.shape_of(p) == mb.shape_of(cfg) == mb.shape_of("llama-3.1-8b")
    with pytest.raises(InputError, match="unknown model"):
        mb.load_card("no-such-model")
    with pytest.raises(InputError, match="lacks"):
        mb.shape_of({"hidden_size": 1})
    with pytest.raises(InputError, match="phase"):
        mb.step_rows(cfg, 1, 1, "train")


def test_hbm_table():
    assert peak_hbm_bps("NVIDIA H200") == 4.8e12
    assert peak_hbm_bps("NVIDIA H100 80GB HBM3") == 3.35e12
    assert peak_hbm_bps("NVIDIA A100-SXM4-80GB") == 2.039e12
    assert peak_hbm_bps("NVIDIA A100-PCIE-40GB") == 1.555e12
    assert peak_hbm_bps("NVIDIA L40S") == 0.864e12
    assert peak_hbm_bps("Tesla T4") is None
    assert canonical_gpu("NVIDIA H200 NVL") == "H200"
    assert same_gpu("NVIDIA H200", "H200") and not same_gpu("NVIDIA H200", "NVIDIA H100 80GB HBM3")


def test_capture_card_object_is_accepted():
    models = pytest.importorskip("stepscope.capture.models")
    card = models.load_card("llama-3.1-8b")
    assert mb.shape_of(card) == mb.shape_of("llama-3.1-8b")
