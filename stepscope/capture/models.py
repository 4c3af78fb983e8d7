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
    # mixture of experts (0: a dense MLP); read by moe_mla_fields from the family's own keys
    experts: int = 0                          # routed experts per MoE layer
    experts_per_token: int = 0                # top-k
    expert_intermediate_size: int = 0         # one expert's intermediate width
    shared_experts: int = 0                   # experts every token goes through
    shared_expert_intermediate_size: int = 0  # the shared experts' intermediate width, all together
    moe_layers: tuple[int, ...] = ()          # indices of the layers whose MLP is the experts
    # multi-head latent attention (DeepSeek; 0: none)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0                      # 0: q is one projection (V2-Lite), else q_a → norm → q_b
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    source: str = ""  # "bundled" or the path it was read from
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def architecture(self) -> str:
        return self.architectures[0] if self.architectures else "?"

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and bool(self.moe_layers)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        """Layers whose MLP is a dense one (DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers)."""
        return self.num_hidden_layers - len(self.moe_layers)

    def attention_params(self) -> int:
        """One layer's attention weights (projections and MLA's latent norms)."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
            else:
                q = h * heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + heads * self.v_head_dim * h
        d = self.head_dim
        return h * (heads + 2 * self.num_key_value_heads) * d + heads * d * h

    def expert_params(self) -> int:
        """One routed expert's weights (gate, up, down)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    def shared_params(self) -> int:
        """One MoE layer's shared experts (and Qwen2-MoE's gate of them, hidden → 1)."""
        if not self.shared_expert_intermediate_size:
            return 0
        gate = self.hidden_size if self.config.get("shared_expert_intermediate_size") else 0
        return 3 * self.hidden_size * self.shared_expert_intermediate_size + gate

    def _layers_params(self, routed: int) -> int:
        h = self.hidden_size
        dense = self.attention_params() + 3 * h * self.intermediate_size + 2 * h
        moe = (self.attention_params() + h * self.experts + routed * self.expert_params()
               + self.shared_params() + 2 * h)
        return dense * self.dense_layers + moe * len(self.moe_layers)

    @property
    def embedding_params(self) -> int:
        """The input embedding table (the LM head is as large unless tied)."""
        return self.vocab_size * self.hidden_size

    def _head_params(self) -> int:
        tied = bool(self.config.get("tie_word_embeddings", False))
        return self.embedding_params * (1 if tied else 2) + self.hidden_size

    @property
    def params(self) -> int:
        """Parameter count of the full model (embedding and LM head counted separately; every
        expert of an MoE model)."""
        return self._layers_params(self.experts) + self._head_params()

    @property
    def active_params(self) -> int:
        """Parameters one token goes through: every weight but the routed experts it is not sent
        to (top-k of them per MoE layer, plus the shared ones); the embedding table counted whole,
        as Qwen and Mistral publish it (DeepSeek's published figure leaves the input embedding
        out: active_params − embedding_params)."""
        return self._layers_params(self.experts_per_token) + self._head_params()

    def kv_cache_elems_per_token(self) -> int:
        """Elements one token keeps in the KV cache per layer: MLA's compressed latent and its
        RoPE key (kv_lora_rank + qk_rope_head_dim), else K and V of every KV head."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_key_value_heads * self.head_dim

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
            "active_params": self.active_params,
            "experts": self.experts,
            "experts_per_token": self.experts_per_token,
            "expert_intermediate_size": self.expert_intermediate_size,
            "shared_experts": self.shared_experts,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "moe_layers": len(self.moe_layers),
            "dense_layers": self.dense_layers,
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": self.q_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "kv_cache_elems_per_token": self.kv_cache_elems_per_token(),
            "source": self.source,
        }


def card_from_config(cfg: dict[str, Any], name: str, source: str) -> Card:
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise InputError(f"model card {source} lacks {', '.join(missing)}")
    for k in _REQUIRED:
        _whole(cfg, k, source, low=1)
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = _whole(cfg, "head_dim", source, low=1, default=max(1, hidden // heads))
    _whole(cfg, "num_key_value_heads", source, low=1, default=heads)
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
        **moe_mla_fields(cfg, source),
        source=source,
        config=dict(cfg),
    )


# The keys each family names its experts with (HF config.json). Mixtral's expert width is its
# intermediate_size; Qwen-MoE's and DeepSeek's is moe_intermediate_size (intermediate_size is then
# the width of their dense layers' MLP).
EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")


def _card(source: str) -> str:
    return f"model card {source}" if source else "model card"


def _whole(cfg: dict[str, Any], key: str, source: str, *, low: int = 0, default: int | None = None) -> int:
    """cfg[key] as a whole number ≥ low (null/absent: default, else InputError naming it)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise InputError(f"{_card(source)} lacks {key}")
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "…"
        raise InputError(f"{_card(source)}: {key} must be a whole number ≥ {low}, not {shown}")
    return v


def moe_mla_fields(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """A config's mixture-of-experts and MLA fields, as Card's keyword arguments (empty for a
    dense model with ordinary attention). Families: Mixtral (num_local_experts, every layer),
    (and gpt-oss, its top-k named experts_per_token), Qwen2-MoE/Qwen3-MoE (num_experts; a layer
    is MoE unless listed in mlp_only_layers, every
    decoder_sparse_step-th one; Qwen2-MoE's shared expert is shared_expert_intermediate_size
    wide), DeepSeek V2/V3 (n_routed_experts, n_shared_experts of moe_intermediate_size each; the
    first first_k_dense_replace layers dense, then every moe_layer_freq-th; MLA from kv_lora_rank)."""
    out: dict[str, Any] = {}
    layers = _whole(cfg, "num_hidden_layers", source, low=1)
    key = next((k for k in EXPERT_KEYS if cfg.get(k) not in (None, 0)), None)
    if key is not None:
        experts = _whole(cfg, key, source, low=1)
        # gpt-oss names its top-k experts_per_token
        k_key = "experts_per_token" if "num_experts_per_tok" not in cfg and "experts_per_token" in cfg \
            else "num_experts_per_tok"
        k = _whole(cfg, k_key, source, low=1)
        if k > experts:
            raise InputError(f"{_card(source)}: {k_key} {k} exceeds the {experts} experts ({key})")
        if key == "num_local_experts":  # Mixtral: every layer's MLP is the experts
            inter = _whole(cfg, "intermediate_size", source, low=1)
            moe = tuple(range(layers))
            shared, shared_inter = 0, 0
        elif key == "num_experts":  # Qwen2-MoE, Qwen3-MoE
            inter = _whole(cfg, "moe_intermediate_size", source, low=1)
            step = _whole(cfg, "decoder_sparse_step", source, low=1, default=1)
            only = cfg.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
                raise InputError(f"{_card(source)}: mlp_only_layers must be a list of layer indices, "
                                 f"not {str(only)[:40]!r}")
            moe = tuple(i for i in range(layers) if i not in set(only) and (i + 1) % step == 0)
            shared_inter = _whole(cfg, "shared_expert_intermediate_size", source, default=0)
            shared = 1 if shared_inter else 0
        else:  # DeepSeek V2/V3
            inter = _whole(cfg, "moe_intermediate_size", source, low=1)
            first = _whole(cfg, "first_k_dense_replace", source, default=0)
            freq = _whole(cfg, "moe_layer_freq", source, low=1, default=1)
            moe = tuple(i for i in range(layers) if i >= first and i % freq == 0)
            shared = _whole(cfg, "n_shared_experts", source, default=0)
            shared_inter = shared * inter
        out.update(experts=experts, experts_per_token=k, expert_intermediate_size=inter,
                   shared_experts=shared, shared_expert_intermediate_size=shared_inter, moe_layers=moe)
    if cfg.get("kv_lora_rank") is not None:
        out.update(kv_lora_rank=_whole(cfg, "kv_lora_rank", source, low=1),
                   q_lora_rank=_whole(cfg, "q_lora_rank", source, default=0),
                   qk_nope_head_dim=_whole(cfg, "qk_nope_head_dim", source, low=1),
                   qk_rope_head_dim=_whole(cfg, "qk_rope_head_dim", source, low=1),
                   v_head_dim=_whole(cfg, "v_head_dim", source, low=1))
    return out


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
