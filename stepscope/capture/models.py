"""Model cards: the shape of a model (no weights), in Hugging Face `config.json` form.

Bundled cards live in `stepscope/data/cards/<name>.json`; a card can also be the path of a
local `config.json` (or of a directory holding one). The torch engine builds random weights
from a card, the vLLM engine writes the card into a temporary model directory and loads it
with `load_format="dummy"`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import InputError

CARDS_DIR = Path(__file__).resolve().parent.parent / "data" / "cards"

# Architectures whose decoder layer is the Llama one (RMSNorm, GQA attention with RoPE,
# SwiGLU MLP): the torch engine can run these.
LLAMA_LIKE = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}

_REQUIRED = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
)


@dataclass(frozen=True)
class Card:
    name: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    vocab_size: int
    torch_dtype: str = "bfloat16"
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    qkv_bias: bool = False
    source: str = ""  # "bundled" or the path it was read from
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def architecture(self) -> str:
        return self.architectures[0] if self.architectures else "?"

    @property
    def params(self) -> int:
        """Parameter count of the full model (embedding and LM head counted separately)."""
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_attention_heads + 2 * self.num_key_value_heads) * d
        o = self.num_attention_heads * d * h
        mlp = 3 * h * self.intermediate_size
        per_layer = qkv + o + mlp + 2 * h
        tied = bool(self.config.get("tie_word_embeddings", False))
        emb = self.vocab_size * h * (1 if tied else 2)
        return per_layer * self.num_hidden_layers + emb + h

    def to_config(self, num_layers: int | None = None) -> dict[str, Any]:
        """The HF config.json dict, optionally with fewer layers."""
        cfg = dict(self.config)
        if num_layers is not None:
            cfg["num_hidden_layers"] = int(num_layers)
            if "max_window_layers" in cfg:
                cfg["max_window_layers"] = min(int(cfg["max_window_layers"]), int(num_layers))
        return cfg

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "architecture": self.architecture,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "torch_dtype": self.torch_dtype,
            "params": self.params,
            "source": self.source,
        }


def card_from_config(cfg: dict[str, Any], name: str, source: str) -> Card:
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise InputError(f"model card {source} lacks {', '.join(missing)}")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = cfg.get("head_dim") or hidden // heads
    archs = tuple(cfg.get("architectures") or ("LlamaForCausalLM",))
    qkv_bias = bool(cfg.get("attention_bias", False)) or cfg.get("model_type") == "qwen2"
    return Card(
        name=name,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        vocab_size=int(cfg["vocab_size"]),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        architectures=archs,
        qkv_bias=qkv_bias,
        source=source,
        config=dict(cfg),
    )


def bundled_names() -> list[str]:
    return sorted(p.stem for p in CARDS_DIR.glob("*.json"))


def list_cards() -> list[Card]:
    return [load_card(n) for n in bundled_names()]


def load_card(name_or_path: str) -> Card:
    """A bundled card by name, or a local config.json (or a directory holding one)."""
    bundled = CARDS_DIR / f"{name_or_path}.json"
    if "/" not in name_or_path and bundled.is_file():
        return card_from_config(_read_json(bundled), name_or_path, "bundled")
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        cfg = _read_json(p)
        stem = p.parent.name if p.name == "config.json" else p.stem
        return card_from_config(cfg, stem or "model", str(p))
    raise InputError(
        f"unknown model {name_or_path!r}: known models are {', '.join(bundled_names())}, "
        "or pass the path of a config.json"
    )


def _read_json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read model card {p}: {e}") from None
    if not isinstance(data, dict):
        raise InputError(f"model card {p} is not a JSON object")
    return data
