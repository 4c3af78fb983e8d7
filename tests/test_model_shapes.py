"""Mixture-of-experts and MLA model cards: the expert and MLA fields read from each family's HF
config keys, parameter counts against the published totals (recomputed here by hand from the
config), bad configs refused in one line, and `trace --model` for these models without a GPU."""

from __future__ import annotations

import json

import pytest

from stepscope.capture.models import CARDS_DIR, load_card
from stepscope.errors import EnvironmentProblem, InputError


def _cfg(name: str) -> dict:
    return json.loads((CARDS_DIR / f"{name}.json").read_text())


# DeepSeek-V3 and Qwen1.5-MoE-A2.7B as published on the Hugging Face Hub (the keys that matter)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
    "tie_word_embeddings": False,
}


def test_expert_fields_come_from_each_familys_keys():
    q, d, m = (load_card(n) for n in ("qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"))
    qc, dc, mc = _cfg("qwen3-30b-a3b"), _cfg("deepseek-v2-lite"), _cfg("mixtral-8x7b")
    assert (q.experts, q.experts_per_token, q.expert_intermediate_size) == (
        qc["num_experts"], qc["num_experts_per_tok"], qc["moe_intermediate_size"]) == (128, 8, 768)
    assert q.shared_experts == 0 and q.moe_layers == tuple(range(48)) and q.dense_layers == 0
    assert (d.experts, d.experts_per_token, d.expert_intermediate_size, d.shared_experts) == (
        dc["n_routed_experts"], dc["num_experts_per_tok"], dc["moe_intermediate_size"], dc["n_shared_experts"])
    assert d.shared_expert_intermediate_size == 2 * 1408
    assert d.moe_layers == tuple(range(1, 27)) and d.dense_layers == dc["first_k_dense_replace"] == 1
    # Mixtral's experts are intermediate_size wide; every layer is MoE
    assert (m.experts, m.experts_per_token, m.expert_intermediate_size) == (
        mc["num_local_experts"], 2, mc["intermediate_size"])
    assert m.dense_layers == 0 and m.shared_experts == 0
    for c in (q, m):
        assert not c.is_mla and c.kv_cache_elems_per_token() == 2 * c.num_key_value_heads * c.head_dim
    # MLA: the compressed KV cache is kv_lora_rank + qk_rope_head_dim per token and layer
    assert d.is_mla and (d.kv_lora_rank, d.q_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim) == (
        512, 0, 128, 64, 128)
    assert d.kv_cache_elems_per_token() == dc["kv_lora_rank"] + dc["qk_rope_head_dim"] == 576
    assert not load_card("llama-3.1-8b").is_moe and load_card("llama-3.1-8b").dense_layers == 32


def _by_hand(h, layers, vocab, attn, dense_inter, dense_layers, experts, k, expert_inter, shared_inter,
             shared_gate=0):
    """Total and active parameters from the published architecture, written out separately
    from Card: per layer attention + (dense MLP | router + experts + shared), 2 norms; the
    embedding and an untied LM head; the final norm."""
    mlp = 3 * h * expert_inter
    moe_layers = layers - dense_layers
    dense = dense_layers * (attn + 3 * h * dense_inter + 2 * h)
    total = dense + moe_layers * (attn + h * experts + experts * mlp + 3 * h * shared_inter + shared_gate + 2 * h)
    active = dense + moe_layers * (attn + h * experts + k * mlp + 3 * h * shared_inter + shared_gate + 2 * h)
    head = 2 * vocab * h + h
    return total + head, active + head


def test_parameter_counts_are_the_published_totals():
    q, d, m = (load_card(n) for n in ("qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"))
    # Qwen3-30B-A3B: GQA 32/4 heads of 128; 30.5B total, 3.3B active
    attn = 2048 * (32 + 8) * 128 + 32 * 128 * 2048
    assert (q.params, q.active_params) == _by_hand(2048, 48, 151936, attn, 6144, 0, 128, 8, 768, 0)
    assert 30.5e9 <= q.params < 30.6e9 and 3.3e9 <= q.active_params < 3.4e9
    # Mixtral-8x7B: 46.7B total, 12.9B active
    attn = 4096 * (32 + 16) * 128 + 32 * 128 * 4096
    assert (m.params, m.active_params) == _by_hand(4096, 32, 32000, attn, 14336, 0, 8, 2, 14336, 0)
    assert 46.6e9 < m.params < 46.8e9 and 12.85e9 < m.active_params < 12.95e9
    # DeepSeek-V2-Lite, MLA without a q LoRA: q [h, 16·(128+64)], kv_a [h, 512+64] + its norm,
    # kv_b [512, 16·(128+128)], o [16·128, h]; 15.7B total, 2.4B active as DeepSeek counts it
    # (without the input embedding: a token reads one row of it)
    attn = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    assert d.attention_params() == attn
    assert (d.params, d.active_params) == _by_hand(2048, 27, 102400, attn, 10944, 1, 64, 6, 1408, 2 * 1408)
    assert 15.7e9 <= d.params < 15.8e9
    assert 2.4e9 <= d.active_params - d.embedding_params < 2.5e9


def test_other_family_configs(tmp_path):
    for cfg in (DEEPSEEK_V3, QWEN15_MOE):
        (tmp_path / f"{cfg['model_type']}.json").write_text(json.dumps(cfg))
    v3 = load_card(str(tmp_path / "deepseek_v3.json"))
    assert v3.q_lora_rank == 1536 and v3.dense_layers == 3 and len(v3.moe_layers) == 58
    # 671B of the main model (the 14B multi-token-prediction module is not a decoder layer), 37B active
    assert 670.5e9 < v3.params < 671.5e9 and 37.0e9 < v3.active_params < 38.0e9
    # gpt-oss-20b (Mixtral's keys, top-k as experts_per_token): 20.9B total, 3.6B active as OpenAI
    # counts it (without the input embedding, like DeepSeek); its biases and sinks not counted
    gpt = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
           "intermediate_size": 2880, "num_local_experts": 32, "experts_per_token": 4, "num_hidden_layers": 24,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
           "tie_word_embeddings": False}
    (tmp_path / "gpt_oss.json").write_text(json.dumps(gpt))
    g = load_card(str(tmp_path / "gpt_oss.json"))
    assert (g.experts, g.experts_per_token, g.expert_intermediate_size) == (32, 4, 2880)
    assert 20.85e9 < g.params < 20.95e9 and 3.55e9 < g.active_params - g.embedding_params < 3.65e9
    q15 = load_card(str(tmp_path / "qwen2_moe.json"))
    assert q15.shared_experts == 1 and q15.shared_expert_intermediate_size == 5632
    # 14.3B total, 2.7B active (Qwen1.5-MoE-A2.7B): q/k/v/o of 2048 with their biases not counted
    attn = 4 * 2048 * 2048
    assert (q15.params, q15.active_params) == _by_hand(2048, 24, 151936, attn, 5632, 0, 60, 4, 1408, 5632,
                                                       shared_gate=2048)
    assert 14.3e9 <= q15.params < 14.4e9 and 2.65e9 < q15.active_params < 2.75e9
    # Qwen's decoder_sparse_step and mlp_only_layers pick the MoE layers
    sparse = {**QWEN15_MOE, "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    (tmp_path / "sparse.json").write_text(json.dumps(sparse))
    c = load_card(str(tmp_path / "sparse.json"))
    assert c.moe_layers == tuple(i for i in range(24) if (i + 1) % 2 == 0 and i != 1) and c.dense_layers == 13


@pytest.mark.parametrize("change,words", [
    ({"num_experts_per_tok": 200}, "num_experts_per_tok 200 exceeds the 128 experts (num_experts)"),
    ({"num_experts_per_tok": None}, "lacks num_experts_per_tok"),
    ({"moe_intermediate_size": None}, "lacks moe_intermediate_size"),
    ({"moe_intermediate_size": "768"}, "moe_intermediate_size must be a whole number ≥ 1, not '768'"),
    ({"num_experts": -4}, "num_experts must be a whole number ≥ 1, not -4"),
    ({"mlp_only_layers": "0,1"}, "mlp_only_layers must be a list of layer indices"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a whole number ≥ 1, not 0"),
    ({"kv_lora_rank": 512}, "lacks qk_nope_head_dim"),
    ({"hidden_size": 2048.5}, "hidden_size must be a whole number ≥ 1, not 2048.5"),
    ({"head_dim": [128]}, "head_dim must be a whole number ≥ 1, not [128]"),
])
def test_bad_expert_and_mla_fields_are_one_line(tmp_path, change, words):
    cfg = {**_cfg("qwen3-30b-a3b"), **change}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(InputError) as e:
        load_card(str(p))
    assert words in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)


def test_bad_config_through_the_cli_is_one_line_and_the_file_untouched(tmp_path):
    from tests.conftest import CliRunner

    from stepscope.cli import app

    p = tmp_path / "config.json"
    text = json.dumps({**_cfg("deepseek-v2-lite"), "n_routed_experts": 4})
    p.write_text(text)
    r = CliRunner().invoke(app, ["trace", "--model", str(p)])
    assert r.exit_code != 0
    assert "num_experts_per_tok 6 exceeds the 4 experts (n_routed_experts)" in r.output
    assert "Traceback" not in r.output and p.read_text() == text


def test_models_command_shows_experts_and_mla():
    from tests.conftest import CliRunner

    from stepscope.cli import app

    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(app, ["models", "--json"]).output)}
    d = rows["deepseek-v2-lite"]
    assert (d["experts"], d["shared_experts"], d["experts_per_token"], d["dense_layers"], d["kv_lora_rank"],
            d["kv_cache_elems_per_token"]) == (64, 2, 6, 1, 512, 576)
    assert rows["qwen3-30b-a3b"]["active_params"] == load_card("qwen3-30b-a3b").active_params
    assert rows["llama-3.1-8b"]["experts"] == 0 and rows["llama-3.1-8b"]["kv_lora_rank"] == 0
    out = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["models"]).output
    assert "128×768 top8" in out and "64+2×1408 top6" in out and "MLA kv 512+64" in out
    assert " 1+26 " in out and "30.5B/3.4B" in out and "46.7B/12.9B" in out


# --- trace --model for MoE and MLA models (no GPU: the command and vLLM's keyword arguments) -------

def test_trace_picks_vllm_for_moe_and_mla_models(monkeypatch, tmp_path):
    import stepscope.capture.run as run

    monkeypatch.setattr(run, "vllm_available", lambda: True)
    for name in ("qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"):
        card, engine = run.validate(run.TraceRequest(model=name))
        assert engine == "vllm" and card.name == name
        cmd = run.engine_command(run.TraceRequest(model=name, mode="graph"), engine, "graph", python="py")
        assert cmd[:3] == ["py", "-m", "stepscope.capture.engines.vllm_engine"]
        assert cmd[cmd.index("--model") + 1] == name  # the engine loads the card by name
    # the torch engine, asked for, is refused in one line that says why
    with pytest.raises(InputError, match="qwen3-30b-a3b is a mixture of experts: use --engine vllm"):
        run.validate(run.TraceRequest(model="qwen3-30b-a3b", engine="torch"))
    with pytest.raises(InputError, match="deepseek-v2-lite is a mixture of experts"):
        run.validate(run.TraceRequest(model="deepseek-v2-lite", engine="torch"))
    # vLLM's TP checks before a GPU is taken: the heads, and every expert's width
    with pytest.raises(InputError, match="--tp 3 does not divide qwen3-30b-a3b's 32 heads"):
        run.validate(run.TraceRequest(model="qwen3-30b-a3b", tp=3))
    odd = tmp_path / "odd" / "config.json"
    odd.parent.mkdir()
    odd.write_text(json.dumps({**_cfg("qwen3-30b-a3b"), "moe_intermediate_size": 100}))
    with pytest.raises(InputError, match="--tp 8 does not divide odd's expert intermediate size 100"):
        run.validate(run.TraceRequest(model=str(odd), tp=8))
    assert run.validate(run.TraceRequest(model="qwen3-30b-a3b", tp=4))[1] == "vllm"
    monkeypatch.setattr(run, "vllm_available", lambda: False)
    with pytest.raises(EnvironmentProblem, match=r"qwen3-30b-a3b \(Qwen3MoeForCausalLM\) runs on vLLM's engine only"):
        run.validate(run.TraceRequest(model="qwen3-30b-a3b"))


def test_the_vllm_engine_needs_nothing_else_for_moe_and_mla(tmp_path):
    """The model directory vLLM loads is the card's config as is (its expert and MLA keys
    included), with fewer layers where --layers asks; the keyword arguments are a dense model's:
    the fixtures' plain captures of qwen3-30b-a3b and deepseek-v2-lite ran with exactly these."""
    from stepscope.capture.engines import vllm_engine as ve

    for name in ("qwen3-30b-a3b", "deepseek-v2-lite"):
        card = load_card(name)
        d = ve.write_model_dir(card.to_config(2), tmp_path / name)
        cfg = json.loads((d / "config.json").read_text())
        assert cfg == {**_cfg(name), "num_hidden_layers": 2, **(
            {"max_window_layers": 2} if "max_window_layers" in cfg else {})}
        # two layers: DeepSeek's first stays dense
        assert load_card(str(d)).moe_layers == ((1,) if card.dense_layers else (0, 1))
    kw = ve.llm_kwargs("/m", phase="decode", batch=1, context=2048, mode="graph", tp=1)
    assert kw["load_format"] == "dummy" and "trust_remote_code" not in kw and "enable_expert_parallel" not in kw
