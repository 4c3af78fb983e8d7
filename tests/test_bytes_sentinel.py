"""The sentinel dispatches every op of the sweep through the engine's ops (CPU, tiny shapes)."""

import json

import pytest

torch = pytest.importorskip("torch")

from stepscope.bytes import sentinel  # noqa: E402

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 100,
        "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 10000.0}


def specs():
    out = [{"op": "gemm", "proj": p, "m": 3} for p in sentinel.PROJS]
    out += [{"op": op, "m": 5} for op in ("norm", "add_norm", "rope", "kv_write", "silu_mul",
                                          "embedding", "argmax", "attn_prefill")]
    out.append({"op": "attn_decode", "m": 2, "batch": 2, "context": 8})
    for s in out:
        s["cell"] = sentinel.cell_id(s)
    return out


def test_every_op_runs_on_cpu():
    recs = sentinel.run_cells(specs(), TINY, device="cpu", warmups=1)
    assert [r["ok"] for r in recs] == [True] * len(recs), recs


@pytest.mark.parametrize("spec,shape", [
    ({"op": "gemm", "proj": "qkv", "m": 3}, (3, 64 + 2 * 32)),
    ({"op": "gemm", "proj": "gate_up", "m": 3}, (3, 192)),
    ({"op": "gemm", "proj": "lm_head", "m": 2}, (2, 100)),
    ({"op": "norm", "m": 5}, (5, 64)),
    ({"op": "silu_mul", "m": 5}, (5, 96)),
    ({"op": "embedding", "m": 5}, (5, 64)),
    ({"op": "argmax", "m": 5}, (5,)),
    ({"op": "attn_prefill", "m": 6}, (6, 64)),
    ({"op": "attn_decode", "m": 2, "batch": 2, "context": 8}, (2, 64)),
])
def test_output_shapes(spec, shape):
    fn = sentinel.Builder(TINY, device="cpu").build(spec)
    out = fn()
    assert tuple(out.shape) == shape


def test_a_failing_cell_does_not_stop_the_rest(tmp_path):
    bad = [{"op": "gemm", "proj": "qkv", "m": 2, "cell": "ok1"},
           {"op": "nope", "m": 1, "cell": "bad"},
           {"op": "norm", "m": 2, "cell": "ok2"}]
    man = tmp_path / "m.jsonl"
    with open(man, "w") as f:
        recs = sentinel.run_cells(bad, TINY, device="cpu", warmups=0, manifest=f)
    assert [r["ok"] for r in recs] == [True, False, True]
    lines = [json.loads(ln) for ln in man.read_text().splitlines()]
    assert lines[1]["error"].startswith("ValueError") and lines[0]["marker"] is False


def test_cli_single_cell_on_cpu(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    man = tmp_path / "m.jsonl"
    rc = sentinel.main(["--op", "gemm", "--proj", "o", "--m", "4", "--model", str(cfg),
                        "--device", "cpu", "--warmups", "1", "--manifest", str(man)])
    assert rc == 0
    assert json.loads(man.read_text())["cell"] == "gemm_o_m4"


def test_cell_ids():
    assert sentinel.cell_id({"op": "gemm", "proj": "qkv", "m": 2048}) == "gemm_qkv_m2048"
    assert sentinel.cell_id({"op": "attn_decode", "m": 64, "batch": 64,
                             "context": 2048}) == "attn_decode_b64_ctx2048"
