"""Model cards: the bundled ones, local config.json paths, bad input, `stepscope models`."""

from __future__ import annotations

import json

import pytest

from stepscope.capture.models import bundled_names, list_cards, load_card
from stepscope.errors import InputError

EXPECTED = {
    # name: (hidden, heads, kv heads, head_dim, intermediate, layers, vocab)
    "llama-3.1-8b": (4096, 32, 8, 128, 14336, 32, 128256),
    "llama-3.1-70b": (8192, 64, 8, 128, 28672, 80, 128256),
    "llama-3.2-1b": (2048, 32, 8, 64, 8192, 16, 128256),
    "qwen2.5-7b": (3584, 28, 4, 128, 18944, 28, 152064),
    "mistral-7b": (4096, 32, 8, 128, 14336, 32, 32768),
    # mixture-of-experts and MLA cards (their expert/MLA fields: test_model_shapes.py)
    "qwen3-30b-a3b": (2048, 32, 4, 128, 6144, 48, 151936),
    "deepseek-v2-lite": (2048, 16, 16, 128, 10944, 27, 102400),
    "mixtral-8x7b": (4096, 32, 8, 128, 14336, 32, 32000),
}
HF_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
           "intermediate_size", "num_hidden_layers", "vocab_size", "torch_dtype", "rope_theta",
           "rms_norm_eps", "max_position_embeddings", "architectures")


def test_bundled_cards_are_the_expected_ones():
    assert set(bundled_names()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_card_shapes(name):
    c = load_card(name)
    got = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
           c.intermediate_size, c.num_hidden_layers, c.vocab_size)
    assert got == EXPECTED[name]
    assert c.torch_dtype == "bfloat16"
    assert c.source == "bundled"
    for k in HF_KEYS:
        if k == "head_dim" and "kv_lora_rank" in c.config:
            continue  # MLA: DeepSeek's config has per-part head sizes instead (qk_nope, qk_rope, v)
        assert k in c.config, k


def test_parameter_counts_are_the_published_sizes():
    p = {c.name: c.params for c in list_cards()}
    assert 8.0e9 < p["llama-3.1-8b"] < 8.1e9
    assert 70.5e9 < p["llama-3.1-70b"] < 70.7e9
    assert 1.23e9 < p["llama-3.2-1b"] < 1.25e9  # tied embeddings
    assert 7.6e9 < p["qwen2.5-7b"] < 7.65e9
    assert 7.2e9 < p["mistral-7b"] < 7.3e9


def test_qwen_has_qkv_bias_llama_does_not():
    assert load_card("qwen2.5-7b").qkv_bias
    assert not load_card("llama-3.1-8b").qkv_bias


def test_local_config_file_and_directory(tmp_path):
    cfg = {"hidden_size": 256, "num_attention_heads": 8, "num_hidden_layers": 3,
           "intermediate_size": 512, "vocab_size": 1000}
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    for arg in (str(d), str(d / "config.json")):
        c = load_card(arg)
        assert c.name == "my-model"
        assert c.head_dim == 32 and c.num_key_value_heads == 8  # derived defaults
        assert c.architecture == "LlamaForCausalLM"
    other = tmp_path / "shape.json"
    other.write_text(json.dumps(cfg))
    assert load_card(str(other)).name == "shape"


def test_to_config_overrides_layers():
    c = load_card("qwen2.5-7b")
    cfg = c.to_config(num_layers=2)
    assert cfg["num_hidden_layers"] == 2 and cfg["max_window_layers"] == 2
    assert c.config["num_hidden_layers"] == 28  # the card itself is untouched


def test_unknown_model_names_the_known_ones():
    with pytest.raises(InputError) as e:
        load_card("llama-9")
    msg = str(e.value)
    assert "unknown model 'llama-9'" in msg and "llama-3.1-8b" in msg and "\n" not in msg


def test_bad_local_cards(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="cannot read model card"):
        load_card(str(p))
    p.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(InputError, match="lacks num_attention_heads"):
        load_card(str(p))


def test_models_command_json():
    from tests.conftest import CliRunner

    from stepscope.cli import app

    r = CliRunner().invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert {row["name"] for row in rows} == set(EXPECTED)
    r = CliRunner().invoke(app, ["models"])
    assert r.exit_code == 0
    for name in EXPECTED:
        assert name in r.output
