"""Theoretical minimum HBM bytes: what the math must touch once, from the model shape.

A model card is a plain dict with the Hugging Face `config.json` keys (hidden_size,
num_attention_heads, num_key_value_heads, head_dim, intermediate_size, num_hidden_layers,
vocab_size, torch_dtype). `load_card` accepts such a dict, a path to a config.json, or a
card name found in `stepscope/data/cards/<name>.json`.

Per op, minimum = every input read once + every output written once, nothing else:

| op           | read                                           | write                     |
|--------------|------------------------------------------------|---------------------------|
| gemm (proj)  | X [T, K] + W [K, N]                            | Y [T, N]                  |
| lm_head      | X [R, H] + W [H, V] (R = rows sampled)         | logits [R, V] (model dtype)|
| norm         | x [T, H] + weight [H]                          | out [T, H]                |
| add_norm     | x + residual [T, H] + weight [H]               | out + residual [T, H]     |
| rope         | q [T, nh*hd] + k [T, kv*hd] + cos/sin rows [T, hd] | q, k (in place)       |
| kv_write     | k, v [T, kv*hd]                                | cache slots [T, 2*kv*hd]  |
| silu_mul     | x [T, 2I]                                      | out [T, I]                |
| embedding    | ids [T] (int64) + rows [T, H]                  | out [T, H]                |
| argmax       | logits [R, V] fp32                             | ids [R] int64             |
| attn_prefill | q [T, nh*hd] + k, v [T, kv*hd]                 | o [T, nh*hd]              |
| attn_decode  | q [B, nh*hd] + KV cache [B, ctx, 2*kv*hd]      | o [B, nh*hd]              |

A step (`step_min_bytes`) is layers × (2 norms, qkv, rope, kv_write, attention, o, gate_up,
silu_mul, down) + embedding + final norm + LM head + argmax. The first norm of layer 0 is a
plain RMSNorm, every later one a fused add+RMSNorm (vLLM's structure). Assumptions:

* decode: T = batch tokens, each sequence reads `context` cached tokens per layer; the LM
  head and the argmax run over the batch rows;
* prefill: `batch` sequences of `context` tokens each (T = batch × context); K/V of the
  prompt are read once by causal attention (FlashAttention keeps scores on chip); only the
  last token of each sequence goes through the LM head;
* logits are written in the model dtype and sampled as fp32 (the seed's 0.51 MB argmax
  read at one token); the fp32 cast between them is framework glue, not counted.

A mixture-of-experts card (experts, top-k k, expert width I_e; capture/models.py reads each
family's keys) replaces the MLP of its MoE layers by: gemm:router [H, E], moe_topk (logits in,
weights and ids out), moe_align (the T·k (token, expert) ids sorted), moe_gemm:gate_up and
moe_gemm:down (each token's row read once, one row out per (token, expert), the weights of the
D = E·(1 − (1 − k/E)^T) distinct experts T tokens reach under uniform routing), moe_act, moe_sum,
and the shared experts' dense MLP (gemm:shared_gate_up, shared_act, gemm:shared_down); dense layers
keep gate_up/silu_mul/down. An MLA card (kv_lora_rank, qk_rope_head_dim, ...) replaces qkv/rope/
kv_write/attention/o by gemm:q (or q_a, lora_norm:q_a, q_b), gemm:kv_a, lora_norm:kv_a, mla_rope,
mla_kv_write (kv_lora_rank + qk_rope_head_dim per token), gemm:kv_b, mla_decode (the latent cache
read once, absorbed) or mla_prefill (K and V expanded from the latent), gemm:o. docs/BYTES.md,
"MoE and MLA steps".

Reproducing the seed (000_d6b9801d5be051df): qkv at M=2048 = 92.27 MB ("92.3 MB"); prefill
attention at 2048 tokens = 41.94 MB ("41.9 MB"); decode attention at batch 64, ctx 2048 =
537.92 MB ("537.92 MB"); the decode step at **batch 1, context 2048** = 15.2899 GB, the
seed's "15.29 GB" (projection + LM-head weights 15.01 GB, KV cache 0.27 GB, activations and
norm weights 0.01 GB). Batch 64 would need 17.2 GB of KV cache alone, so the seed's decode
ledger is a single-sequence step at a 2048-token context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.classes import CLASS_OF_OP
from stepscope.errors import InputError

DTYPE_BYTES = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float32": 4, "fp32": 4, "float": 4, "float8_e4m3fn": 1, "fp8": 1,
}

# Built-in fallback so this module works before stepscope/data/cards/ exists.
BUILTIN_CARDS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 14336, "num_hidden_layers": 32,
        "vocab_size": 128256, "torch_dtype": "bfloat16",
    },
}

CARDS_DIR = Path(__file__).resolve().parent.parent / "data" / "cards"


@dataclass(frozen=True)
class Shape:
    """The numbers minimum bytes depend on, read from a card."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    elem: int  # bytes per element of weights/activations/KV cache
    # mixture of experts (0: dense); the MoE layers of `layers` (the rest run the dense MLP)
    experts: int = 0
    top_k: int = 0
    expert_inter: int = 0
    shared_inter: int = 0     # the shared experts' intermediate width, all together
    moe_layers: int = 0
    # multi-head latent attention (0: none)
    kv_lora: int = 0
    q_lora: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head: int = 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def mla_cache_dim(self) -> int:
        """MLA's KV cache per token and layer: the compressed latent and the RoPE key."""
        return self.kv_lora + self.qk_rope

    @property
    def q_dim(self) -> int:
        if self.kv_lora:
            return self.heads * (self.qk_nope + self.qk_rope)
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    def expected_experts(self, tokens: int) -> float:
        """The distinct experts `tokens` tokens reach in one MoE layer, under uniform routing."""
        from stepscope.analysis.moe import expected_distinct_experts

        return expected_distinct_experts(self.experts, self.top_k, tokens)

    def proj(self, name: str) -> tuple[int, int]:
        """(K, N) of a projection GEMM: Y[T, N] = X[T, K] @ W[K, N]."""
        h, i = self.hidden, self.intermediate
        table = {
            "qkv": (h, self.qkv_dim), "o": (self.q_dim, h), "gate_up": (h, 2 * i),
            "down": (i, h), "lm_head": (h, self.vocab),
        }
        if self.experts:
            table.update(router=(h, self.experts))
            if self.shared_inter:
                table.update(shared_gate_up=(h, 2 * self.shared_inter), shared_down=(self.shared_inter, h))
        if self.kv_lora:
            table.update(o=(self.heads * self.v_head, h), kv_a=(h, self.mla_cache_dim),
                         # the latent's up-projection to K (no RoPE part) and V; decode runs it
                         # absorbed into q and the output (the same weights)
                         kv_b=(self.kv_lora, self.heads * (self.qk_nope + self.v_head)))
            if self.q_lora:
                table.update(q_a=(h, self.q_lora), q_b=(self.q_lora, self.q_dim))
            else:
                table.update(q=(h, self.q_dim))
        if name not in table:
            raise InputError(f"unknown projection {name!r} (expected one of {', '.join(table)})")
        return table[name]


def load_card(card: dict | str | Path) -> dict:
    """A card dict from a dict, a config.json path, or a card name."""
    if isinstance(card, dict):
        return card
    cfg = getattr(card, "config", None)  # stepscope.capture.models.Card
    if isinstance(cfg, dict) and "hidden_size" in cfg:
        return cfg
    if hasattr(card, "hidden_size"):
        keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "num_hidden_layers", "vocab_size", "torch_dtype",
                "rms_norm_eps", "rope_theta")
        return {k: getattr(card, k) for k in keys if hasattr(card, k)}
    p = Path(card)
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise InputError(f"model card {p} does not exist")
        try:
            return json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"model card {p} is not readable JSON: {e}") from None
    name = str(card).lower()
    f = CARDS_DIR / f"{name}.json"
    if f.exists():
        return json.loads(f.read_text())
    if name in BUILTIN_CARDS:
        return BUILTIN_CARDS[name]
    known = sorted({*BUILTIN_CARDS, *(x.stem for x in CARDS_DIR.glob("*.json"))})
    raise InputError(f"unknown model {card!r}; known: {', '.join(known)} (or pass a config.json)")


# The largest value a card's size may have: far past any model's (hidden 16,384 and vocab 262,144
# are today's largest), low enough that a step's bytes stay integers polars holds (a card saying
# hidden_size=2^62 overflowed the budget's 128-bit sums).
CARD_MAX = {"hidden_size": 1 << 20, "num_attention_heads": 1 << 16, "num_key_value_heads": 1 << 16,
            "head_dim": 1 << 16, "intermediate_size": 1 << 22, "num_hidden_layers": 1 << 12,
            "vocab_size": 1 << 24}
# a step's minimum bytes beyond this is no step a GPU runs (2^62 B: 4.6 EB), and its sums and
# differences would leave 64 bits
MAX_STEP_BYTES = 1 << 62


def _size(c: dict, key: str, default: int | None = None) -> int:
    """The card's `key` as a whole number from 1 to CARD_MAX[key], else InputError naming it."""
    v = c.get(key)
    if v is None or v == 0:
        if default is not None:
            return default
        if key not in c:
            raise InputError(f"model card lacks {key!r}")
    given = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "…"
    if isinstance(v, float) and v.is_integer() and abs(v) <= CARD_MAX[key]:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= CARD_MAX[key]:
        raise InputError(f"model card: {key} must be a whole number from 1 to {CARD_MAX[key]:,}, not {given}")
    return v


def shape_of(card: dict | str | Path) -> Shape:
    c = load_card(card)
    if not isinstance(c, dict):
        raise InputError(f"model card must be a JSON object of config.json keys, not {type(c).__name__}")
    if isinstance(c.get("text_config"), dict) and "hidden_size" not in c:  # multimodal HF configs nest the LM
        c = c["text_config"]
    hidden = _size(c, "hidden_size")
    heads = _size(c, "num_attention_heads")
    kv = _size(c, "num_key_value_heads", heads)
    hd = _size(c, "head_dim", max(hidden // heads, 1))
    if heads * hd > CARD_MAX["hidden_size"] or kv * hd > CARD_MAX["hidden_size"]:
        raise InputError(f"model card: attention heads x head_dim must stay within {CARD_MAX['hidden_size']:,}, "
                         f"not {max(heads, kv) * hd:,}")
    dt = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    layers = _size(c, "num_hidden_layers")
    return Shape(
        hidden=hidden, heads=heads, kv_heads=kv, head_dim=hd,
        intermediate=_size(c, "intermediate_size"), layers=layers,
        vocab=_size(c, "vocab_size"), elem=DTYPE_BYTES.get(dt.lower(), 2), **_moe_mla(c),
    )


def _moe_mla(c: dict) -> dict[str, int]:
    """Shape's expert and MLA fields, read as the model cards read them (capture/models.py:
    one place knows each family's keys), each bounded like the card's other sizes."""
    from stepscope.capture.models import moe_mla_fields

    f = moe_mla_fields(c, "")
    out = {"experts": f.get("experts", 0), "top_k": f.get("experts_per_token", 0),
           "expert_inter": f.get("expert_intermediate_size", 0),
           "shared_inter": f.get("shared_expert_intermediate_size", 0), "moe_layers": len(f.get("moe_layers", ())),
           "kv_lora": f.get("kv_lora_rank", 0), "q_lora": f.get("q_lora_rank", 0),
           "qk_nope": f.get("qk_nope_head_dim", 0), "qk_rope": f.get("qk_rope_head_dim", 0),
           "v_head": f.get("v_head_dim", 0)}
    bound = {"experts": 1 << 16, "top_k": 1 << 16, "expert_inter": CARD_MAX["intermediate_size"],
             "shared_inter": CARD_MAX["intermediate_size"], "kv_lora": CARD_MAX["hidden_size"],
             "q_lora": CARD_MAX["hidden_size"], "qk_nope": CARD_MAX["head_dim"], "qk_rope": CARD_MAX["head_dim"],
             "v_head": CARD_MAX["head_dim"]}
    for k, most in bound.items():
        if out[k] > most:
            raise InputError(f"model card: {k} must stay within {most:,}, not {out[k]:,}")
    return out


def _rw(read: int, write: int) -> dict[str, int]:
    return {"read_bytes": int(read), "write_bytes": int(write), "min_bytes": int(read + write)}


def op_min_bytes(
    s: Shape, op: str, tokens: int = 1, *, proj: str | None = None,
    batch: int | None = None, context: int | None = None,
) -> dict[str, int]:
    """Minimum read/write bytes of one call of `op` over `tokens` rows.

    op: gemm (with proj qkv|o|gate_up|down|lm_head, and the MoE/MLA projections of Shape.proj),
    lm_head, norm, add_norm, rope, kv_write, silu_mul, embedding, argmax, attn_prefill (tokens =
    one sequence's length, times `batch` sequences), attn_decode (batch sequences × context cached
    tokens; tokens ignored); MLA: lora_norm (proj q_a|kv_a), mla_rope, mla_kv_write, mla_decode,
    mla_prefill; MoE: moe_topk, moe_align, moe_gemm (proj gate_up|down), moe_act, moe_sum,
    shared_act.
    """
    e, t = s.elem, tokens
    if op == "gemm" and proj == "lm_head":
        op = "lm_head"
    if op == "gemm":
        if proj is None:
            raise InputError("gemm needs a projection (qkv, o, gate_up, down, lm_head)")
        k, n = s.proj(proj)
        return _rw(t * k * e + k * n * e, t * n * e)
    if op == "lm_head":
        return _rw(t * s.hidden * e + s.hidden * s.vocab * e, t * s.vocab * e)
    if op == "norm":
        return _rw(t * s.hidden * e + s.hidden * e, t * s.hidden * e)
    if op == "add_norm":
        return _rw(2 * t * s.hidden * e + s.hidden * e, 2 * t * s.hidden * e)
    if op == "rope":
        qk = t * (s.q_dim + s.kv_dim) * e
        return _rw(qk + t * s.head_dim * e, qk)
    if op == "kv_write":
        return _rw(2 * t * s.kv_dim * e, 2 * t * s.kv_dim * e)
    if op == "silu_mul":
        return _rw(t * 2 * s.intermediate * e, t * s.intermediate * e)
    if op == "embedding":
        return _rw(t * 8 + t * s.hidden * e, t * s.hidden * e)
    if op == "argmax":
        return _rw(t * s.vocab * 4, t * 8)
    if op == "attn_prefill":
        b = batch or 1
        tt = b * t
        return _rw(tt * (s.q_dim + 2 * s.kv_dim) * e, tt * s.q_dim * e)
    if op == "attn_decode":
        b = batch if batch is not None else t
        ctx = context or 0
        return _rw(b * s.q_dim * e + b * ctx * 2 * s.kv_dim * e, b * s.q_dim * e)
    # --- multi-head latent attention: one cache row of kv_lora + qk_rope per token and layer
    if op == "lora_norm":  # MLA's RMSNorm of the latent (proj kv_a) or of q's LoRA (proj q_a)
        d = s.q_lora if proj == "q_a" else s.kv_lora
        return _rw(t * d * e + d * e, t * d * e)
    if op == "mla_rope":  # q's RoPE part of every head and the one shared RoPE key
        qk = t * (s.heads + 1) * s.qk_rope * e
        return _rw(qk + t * s.qk_rope * e, qk)
    if op == "mla_kv_write":
        return _rw(t * s.mla_cache_dim * e, t * s.mla_cache_dim * e)
    if op == "mla_decode":  # absorbed: q in the latent space of every head, the latent cache read once
        b = batch if batch is not None else t
        ctx = context or 0
        return _rw(b * s.heads * s.mla_cache_dim * e + b * ctx * s.mla_cache_dim * e, b * s.heads * s.kv_lora * e)
    if op == "mla_prefill":  # K and V expanded from the latent (kv_b), then ordinary attention
        tt = (batch or 1) * t
        qk = s.heads * (s.qk_nope + s.qk_rope)
        return _rw(tt * (2 * qk + s.heads * s.v_head) * e, tt * s.heads * s.v_head * e)
    # --- mixture of experts (per MoE layer; `distinct`: the experts the T tokens reach)
    if op == "moe_topk":  # router logits [T, E] → weights fp32 + ids int32 [T, k]
        return _rw(t * s.experts * e, t * s.top_k * 8)
    if op == "moe_align":  # the T·k (token, expert) ids sorted by expert, with each expert's offset
        return _rw(t * s.top_k * 4, t * s.top_k * 4 + (s.experts + 1) * 4)
    if op == "moe_gemm":
        d = s.expected_experts(t)
        if proj == "gate_up":  # each token's row read once, one output row per (token, expert)
            return _rw(t * s.hidden * e + round(d * s.hidden * 2 * s.expert_inter * e), t * s.top_k * 2 * s.expert_inter * e)
        if proj == "down":
            return _rw(t * s.top_k * s.expert_inter * e + round(d * s.expert_inter * s.hidden * e), t * s.top_k * s.hidden * e)
        raise InputError("moe_gemm needs a projection (gate_up, down)")
    if op == "moe_act":
        return _rw(t * s.top_k * 2 * s.expert_inter * e, t * s.top_k * s.expert_inter * e)
    if op == "moe_sum":  # each token's k expert outputs, weighted, summed
        return _rw(t * s.top_k * s.hidden * e, t * s.hidden * e)
    if op == "shared_act":
        return _rw(t * 2 * s.shared_inter * e, t * s.shared_inter * e)
    raise InputError(f"no minimum-bytes model for op {op!r}")


def step_rows(
    card: dict | str | Path, batch: int, context: int, phase: str = "decode"
) -> list[dict[str, Any]]:
    """Per-op rows of one step: op, proj, class, calls, tokens, per-call and total minimum."""
    s = shape_of(card)
    if phase not in ("decode", "prefill"):
        raise InputError(f"phase must be decode or prefill, not {phase!r}")
    if batch < 1 or context < (1 if phase == "prefill" else 0):
        raise InputError("batch must be >= 1 and context >= 1 for prefill")
    L = s.layers
    t = batch if phase == "decode" else batch * context
    rows_sampled = batch  # one logits row per sequence in both phases
    if phase == "decode":
        attn = ("attn_decode", "attention_decode", dict(batch=batch, context=context), t)
    else:
        attn = ("attn_prefill", "attention_prefill", dict(batch=batch), context)
    plan: list[tuple[str, str | None, str, int, int, dict]] = [
        # op, proj, class, calls, tokens, extra
        ("embedding", None, "embedding", 1, t, {}),
        ("norm", None, "norm", 1, t, {}),
        ("add_norm", None, "norm", 2 * L, t, {}),  # 2 per layer minus layer 0's first, + final
        *(_mla_plan(s, phase, batch, context, t) if s.kv_lora else [
            ("gemm", "qkv", "gemm", L, t, {}),
            ("rope", None, "rope", L, t, {}),
            ("kv_write", None, "kv_cache_write", L, t, {}),
            (attn[0], None, attn[1], L, attn[3], attn[2]),
            ("gemm", "o", "gemm", L, t, {})]),
        *_mlp_plan(s, t),
        ("gemm", "lm_head", "gemm", 1, rows_sampled, {}),
        ("argmax", None, "sampling", 1, rows_sampled, {}),
    ]
    out = []
    for op, proj, cls, calls, tokens, extra in plan:
        if calls == 0:
            continue  # e.g. the dense MLP of a model whose every layer is MoE
        m = op_min_bytes(s, op, tokens, proj=proj, **extra)
        cls = CLASS_OF_OP[op]  # the class table's min_ops decide (the plan's column says the same)
        out.append({
            "op": op if proj is None else f"{op}:{proj}", "proj": proj, "class": cls,
            "calls": calls, "tokens": tokens,
            "min_bytes_per_call": m["min_bytes"], "min_bytes": m["min_bytes"] * calls,
            "read_bytes": m["read_bytes"] * calls, "write_bytes": m["write_bytes"] * calls,
        })
    total = sum(r["min_bytes"] for r in out)
    if total >= MAX_STEP_BYTES:
        raise InputError(f"a {phase} step of batch {batch:,} and context {context:,} on this model needs {total:.3e} "
                         "bytes at least, beyond 2^62: no GPU runs such a step (check --batch, --context and the "
                         "model card)")
    return out


def _mla_plan(s: Shape, phase: str, batch: int, context: int, t: int) -> list[tuple]:
    """An MLA layer's attention: q (one projection, or q_a → norm → q_b), the latent kv_a and its
    norm, RoPE, the latent cache write, kv_b, attention over the latent cache (decode: absorbed)
    or over K/V expanded from it (prefill), o."""
    L = s.layers
    q = ([("gemm", "q_a", "gemm", L, t, {}), ("lora_norm", "q_a", "norm", L, t, {}),
          ("gemm", "q_b", "gemm", L, t, {})] if s.q_lora else [("gemm", "q", "gemm", L, t, {})])
    attn = (("mla_decode", "attention_decode", L, t, dict(batch=batch, context=context)) if phase == "decode"
            else ("mla_prefill", "attention_prefill", L, context, dict(batch=batch)))
    return [*q,
            ("gemm", "kv_a", "gemm", L, t, {}), ("lora_norm", "kv_a", "norm", L, t, {}),
            ("mla_rope", None, "rope", L, t, {}), ("mla_kv_write", None, "kv_cache_write", L, t, {}),
            ("gemm", "kv_b", "gemm", L, t, {}),
            (attn[0], None, attn[1], attn[2], attn[3], attn[4]),
            ("gemm", "o", "gemm", L, t, {})]


def _mlp_plan(s: Shape, t: int) -> list[tuple]:
    """The dense layers' MLP, then the MoE layers': router GEMM, top-k, align/sort, the experts'
    GEMMs over the distinct experts the T tokens reach, SiLU·mul, moe_sum, the shared experts."""
    from stepscope.analysis.moe import MOE_GEMM, MOE_ROUTING

    dense = [("gemm", "gate_up", "gemm", s.dense_layers, t, {}), ("silu_mul", None, "activation", s.dense_layers, t, {}),
             ("gemm", "down", "gemm", s.dense_layers, t, {})]
    if not s.experts:
        return dense
    m = s.moe_layers
    shared = ([("gemm", "shared_gate_up", "gemm", m, t, {}), ("shared_act", None, "activation", m, t, {}),
               ("gemm", "shared_down", "gemm", m, t, {})] if s.shared_inter else [])
    return [*dense,
            ("gemm", "router", "gemm", m, t, {}), ("moe_topk", None, MOE_ROUTING, m, t, {}),
            ("moe_align", None, MOE_ROUTING, m, t, {}),
            ("moe_gemm", "gate_up", MOE_GEMM, m, t, {}), ("moe_act", None, "activation", m, t, {}),
            ("moe_gemm", "down", MOE_GEMM, m, t, {}), ("moe_sum", None, MOE_ROUTING, m, t, {}),
            *shared]


def moe_note(card: dict | str | Path, batch: int, context: int, phase: str = "decode") -> str | None:
    """What an MoE step's minimum assumes about routing, with its figures (None for a dense model)."""
    from stepscope.analysis.moe import ROUTING_ASSUMPTION

    s = shape_of(card)
    if not s.experts or not s.moe_layers:
        return None
    t = batch if phase == "decode" else batch * context
    d = s.expected_experts(t)
    per_expert = 3 * s.hidden * s.expert_inter * s.elem * s.moe_layers
    least = f"; the least any routing reads is {s.top_k} experts' weights a layer ({per_expert * s.top_k / 1e9:.2f} GB)" \
        if d > s.top_k + 0.05 else ""
    return (f"MoE minimum: the weights of the distinct experts the step's {t:,} token(s) route to, "
            f"{d:,.1f} of {s.experts} per MoE layer (top-{s.top_k}) in {s.moe_layers} MoE layer(s)"
            + (f" and {s.dense_layers} dense" if s.dense_layers else "")
            + (", plus the shared experts" if s.shared_inter else "") + f"; {ROUTING_ASSUMPTION}{least}")


def step_min_bytes(card: dict | str | Path, batch: int = 1, context: int = 2048,
                   phase: str = "decode") -> int:
    """Total theoretical minimum HBM bytes of one step."""
    return sum(r["min_bytes"] for r in step_rows(card, batch, context, phase))
