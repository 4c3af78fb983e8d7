"""The torch engine's step on the CPU with tiny shapes (same code as on the GPU): checked
against an independent reference Llama, prefill/decode consistency through the KV cache, TP
on gloo, the NVTX range name; and the Triton kernels (interpreter) against the torch ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stepscope.capture.engines import ops  # noqa: E402
from stepscope.capture.engines.torch_engine import (  # noqa: E402
    LlamaStep, StepSpec, main, step_range_name)
from stepscope.capture.models import card_from_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def tiny(tmp_path=None, **kw):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 101,
           "torch_dtype": "float32", "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 128}
    cfg.update(kw)
    if tmp_path is not None:
        p = tmp_path / "config.json"
        p.write_text(json.dumps(cfg))
        return p
    return card_from_config(cfg, "tiny", "test")


# --- an independent reference: textbook Llama, written without ops.py ----------------------
def reference_prefill_logits(m: LlamaStep, ids: torch.Tensor, batch: int, seq: int):
    c = m.card
    h_, d, hq, hkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * w

    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):  # [B, H, S, D], rotate_half convention (NeoX)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = m.embed.double()[ids].view(batch, seq, h_)
    mask = torch.full((seq, seq), float("-inf"), dtype=torch.float64).triu(1)
    for lw in m.layer_weights:
        y = norm(x, lw["in_norm"].double())
        qkv = y @ lw["qkv"].double().T
        if lw["qkv_bias"] is not None:
            qkv = qkv + lw["qkv_bias"].double()
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
        q = rope(q.view(batch, seq, hq, d).transpose(1, 2))
        k = rope(k.view(batch, seq, hkv, d).transpose(1, 2))
        v = v.view(batch, seq, hkv, d).transpose(1, 2)
        k = k.repeat_interleave(hq // hkv, 1)
        v = v.repeat_interleave(hq // hkv, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + mask, -1) @ v
        x = x + att.transpose(1, 2).reshape(batch, seq, hq * d) @ lw["o"].double().T
        y = norm(x, lw["post_norm"].double())
        g, u = (y @ lw["gate_up"].double().T).split(c.intermediate_size, -1)
        x = x + (torch.nn.functional.silu(g) * u) @ lw["down"].double().T
    x = norm(x, m.final_norm.double())
    return x[:, -1] @ m.lm_head.double().T


@pytest.mark.parametrize("kw", [{}, {"num_key_value_heads": 1, "model_type": "qwen2",
                                     "architectures": ["Qwen2ForCausalLM"]}])
def test_prefill_matches_reference_llama(kw):
    card = tiny(**kw)
    m = LlamaStep(card, batch=2, max_slots=8, device="cpu", init_std=0.2)
    ids, pos, slots = m.prefill_inputs(7, seed=3)
    nxt, logits = m.forward(ids, pos, slots, phase="prefill", context=7, return_logits=True)
    ref = reference_prefill_logits(m, ids, 2, 7)
    assert torch.allclose(logits.double(), ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(nxt, ref.argmax(-1))


def test_decode_through_the_cache_equals_a_longer_prefill():
    m = LlamaStep(tiny(), batch=3, max_slots=10, device="cpu", init_std=0.2)
    s = 6
    ids_all, pos, slots = m.prefill_inputs(s + 1, seed=5)
    _, full = m.forward(ids_all, pos, slots, phase="prefill", context=s + 1, return_logits=True)
    ids2 = ids_all.view(3, s + 1)
    _, p, sl = m.prefill_inputs(s)
    m.forward(ids2[:, :s].reshape(-1), p, sl, phase="prefill", context=s)
    _, dp, ds = m.decode_inputs(s)
    assert dp.tolist() == [s] * 3 and ds.tolist() == [s, 10 + s, 20 + s]
    nd, dec = m.forward(ids2[:, s], dp, ds, phase="decode", context=s, return_logits=True)
    assert torch.allclose(dec, full, atol=1e-4)


def test_bf16_step_runs_and_layers_override():
    card = tiny(torch_dtype="bfloat16")
    m = LlamaStep(card, layers=1, batch=2, max_slots=5, device="cpu")
    assert m.dtype == torch.bfloat16 and len(m.layer_weights) == 1
    ids, pos, slots = m.decode_inputs(4)
    out = m.forward(ids, pos, slots, phase="decode", context=4)
    assert out.shape == (2,) and out.dtype == torch.int64


def test_step_range_names():
    spec = StepSpec(model="llama-3.1-8b", phase="decode", batch=8, context=2048, mode="graph")
    assert step_range_name(spec, "llama-3.1-8b", 32) == (
        "step phase=decode batch=8 tokens=8 context=2048 model=llama-3.1-8b mode=graph tp=1 "
        "layers=32")
    spec = StepSpec(model="x", phase="prefill", batch=2, context=512, tp=2)
    assert step_range_name(spec, "llama-3.2-1b", 4) == (
        "step phase=prefill batch=2 tokens=1024 context=512 model=llama-3.2-1b mode=eager tp=2 "
        "layers=4")


def test_engine_main_on_cpu(tmp_path, capsys):
    (tmp_path / "tiny-llama").mkdir()
    cfg = tiny(tmp_path / "tiny-llama")
    assert main(["--model", str(cfg), "--device", "cpu", "--batch", "2", "--context", "5",
                 "--layers", "1"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("stepscope-engine:")]
    assert [ln.split()[1].split("=")[0] for ln in lines] == ["phase"] * 4 + ["result"]
    assert lines[2].split()[1] == "phase=untraced"
    res = json.loads(lines[-1].split("result=", 1)[1])
    assert res["range"] == ("step phase=decode batch=2 tokens=2 context=5 model=tiny-llama "
                            "mode=eager tp=1 layers=1")
    assert len(res["next_tokens"]) == 2
    # the untraced twin: 20 steps of the same shape by default, each timed three ways
    u = res["untraced"]
    assert u["steps"] == 20 and u["step_time_ns"]["n"] == 20
    assert 0 < u["host_ns"]["median"] <= u["wall_ns"]["median"]
    assert u["step_time_ns"]["min"] <= u["step_time_ns"]["median"] <= u["step_time_ns"]["max"]


def _engine(capsys, *args):
    assert main(list(args)) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if "result=" in ln][-1]
    return json.loads(line.split("result=", 1)[1])


def test_engine_several_steps_without_nvtx(tmp_path, capsys):
    """--steps 3: each decode step feeds its token to the next at the next position, as an
    engine loop does (the first step is the one a single-step capture runs)."""
    cfg = str(tiny(tmp_path))
    base = ["--model", cfg, "--device", "cpu", "--batch", "2", "--context", "5",
            "--untraced-steps", "0", "--warmup", "1"]
    one = _engine(capsys, *base)
    three = _engine(capsys, *base, "--steps", "3", "--no-nvtx")
    assert three["range"] is None and three["captured_steps"] == 3
    assert three["untraced"] is None
    assert three["step_tokens"][0] == one["next_tokens"]
    assert three["next_tokens"] == three["step_tokens"][2]
    # the reference: the same model decoding token by token through its KV cache
    spec = StepSpec(model=cfg, batch=2, context=5, steps=3)
    m = LlamaStep(tiny(), layers=None, batch=2, max_slots=8, device="cpu", seed=0)
    ids, pos, slots = m.decode_inputs(5, 0)
    want = []
    for i in range(3):
        nxt = m.forward(ids, pos, slots, phase="decode", context=5)
        want.append(nxt.tolist())
        ids, pos, slots = nxt, pos + 1, slots + 1
    assert spec.steps == 3 and three["step_tokens"] == want


def test_engine_step_name_and_compiled_mode(tmp_path, capsys, monkeypatch):
    cfg = str(tiny(tmp_path))
    base = ["--model", cfg, "--device", "cpu", "--batch", "2", "--context", "5",
            "--layers", "1", "--untraced-steps", "2", "--warmup", "1"]
    bare = _engine(capsys, *base, "--step-name", "step")
    assert bare["range"] == "step"
    # the engine's compiled mode (torch.compile of the step, the torch ops, two warm-ups) traced
    # by dynamo and AOT autograd as on the GPU, but not lowered by Inductor: on the CPU Inductor
    # writes and builds C++ (16-36 s of the 2-core box's suite on a cold compile cache, 5-9 s
    # warm), never what runs on the GPU, where it emits Triton
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": "aot_eager"}))
    compiled = _engine(capsys, *base, "--mode", "compiled")
    assert compiled["spec"]["mode"] == "compiled" and compiled["triton_ops"] is False
    assert compiled["next_tokens"] == bare["next_tokens"]


def test_engine_main_unknown_model(capsys):
    assert main(["--model", "nope", "--device", "cpu"]) == 2
    assert "unknown model" in capsys.readouterr().err


def _tp_args(cfg: Path, tp: int, phase: str) -> list[str]:
    return ["--model", str(cfg), "--device", "cpu", "--tp", str(tp), "--batch", "3", "--context", "6",
            "--phase", phase, "--shard-from-full"]


def _run_tp(cfg: Path, tp: int, phase: str) -> list[int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(tp), "-m", "stepscope.capture.engines.torch_engine", *_tp_args(cfg, tp, phase)]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    line = [ln for ln in cp.stdout.splitlines() if "result=" in ln][0]
    return json.loads(line.split("result=", 1)[1])["next_tokens"]


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_tensor_parallel_two_ranks_compute_the_same_step(tmp_path, phase, capsys):
    # one KV head for two ranks (replicated), an odd vocabulary (padded LM-head shard), bias
    cfg = tiny(tmp_path, num_key_value_heads=1, vocab_size=103, model_type="qwen2",
               architectures=["Qwen2ForCausalLM"])
    # the two ranks through torchrun on gloo; the one-rank step in this process (no torchrun:
    # WORLD_SIZE unset is one rank, as torchrun's single process would be)
    assert _run_tp(cfg, 2, phase) == _engine(capsys, *_tp_args(cfg, 1, phase))["next_tokens"]


# --- Triton kernels vs the torch fallbacks, through Triton's CPU interpreter ----------------
TRITON_CHECK = r"""
import os, torch
from stepscope.capture.engines import ops
assert ops.HAS_TRITON
torch.manual_seed(0)
dt = torch.bfloat16
def both(fn):
    os.environ["STEPSCOPE_OPS"] = "triton"; a = fn()
    os.environ["STEPSCOPE_OPS"] = "torch"; b = fn()
    return a, b
def close(a, b, what):
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item()
    scale = b.abs().max().item()
    assert err <= 0.02 * max(scale, 1.0), (what, err, scale)
    print("ok", what, err)
T, H = 5, 96
x = torch.randn(T, H, dtype=dt); w = torch.randn(H, dtype=dt); r = torch.randn(T, H, dtype=dt)
close(*both(lambda: ops.rms_norm(x, w, 1e-5)), "rms_norm")
a, b = both(lambda: ops.fused_add_rms_norm(x, r, w, 1e-5))
close(a[0], b[0], "fused_add_rms_norm.out"); close(a[1], b[1], "fused_add_rms_norm.residual")
g = torch.randn(T, 2 * 80, dtype=dt)
close(*both(lambda: ops.silu_and_mul(g)), "silu_and_mul")
D, hq, hk = 16, 4, 2
cache = ops.make_cos_sin_cache(D, 64, 10000.0, torch.float32)
pos = torch.tensor([0, 3, 7, 63, 5])
def qkv():
    return torch.randn(T, (hq + 2 * hk) * D, generator=torch.Generator().manual_seed(1)).to(dt)
def rope():
    t = qkv()
    ops.rotary_embedding(pos, t[:, :hq * D], t[:, hq * D:(hq + hk) * D], cache)
    return t
a, b = both(rope)
close(a, b, "rotary_embedding")
assert torch.equal(a[:, (hq + hk) * D:], qkv()[:, (hq + hk) * D:])  # v untouched
def cachew():
    kc = torch.zeros(10, hk, D, dtype=dt); vc = torch.zeros(10, hk, D, dtype=dt)
    t = qkv()
    ops.reshape_and_cache(t[:, hq * D:(hq + hk) * D], t[:, (hq + hk) * D:], kc, vc,
                          torch.tensor([9, 0, 4, 2, 7]))
    return torch.cat([kc, vc])
a, b = both(cachew)
assert torch.equal(a, b) and a.abs().sum() > 0
print("ok reshape_and_cache")
names = [k.fn.__name__ if hasattr(k, "fn") else k.__name__ for k in (
    ops.rms_norm_kernel, ops.fused_add_rms_norm_kernel, ops.rotary_embedding_kernel,
    ops.reshape_and_cache_kernel, ops.act_and_mul_kernel)]
print("names", names)
"""


def test_triton_kernels_match_torch_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    cp = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True,
                        env=env, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert cp.stdout.count("ok ") == 6
    assert ("names ['rms_norm_kernel', 'fused_add_rms_norm_kernel', 'rotary_embedding_kernel', "
            "'reshape_and_cache_kernel', 'act_and_mul_kernel']") in cp.stdout


def test_ops_use_torch_on_cpu_by_default():
    assert ops.use_triton(torch.empty(1)) is False
