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

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    def proj(self, name: str) -> tuple[int, int]:
        """(K, N) of a projection GEMM: Y[T, N] = X[T, K] @ W[K, N]."""
        h, i = self.hidden, self.intermediate
        table = {
            "qkv": (h, self.qkv_dim), "o": (self.q_dim, h), "gate_up": (h, 2 * i),
            "down": (i, h), "lm_head": (h, self.vocab),
        }
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
    return Shape(
        hidden=hidden, heads=heads, kv_heads=kv, head_dim=hd,
        intermediate=_size(c, "intermediate_size"), layers=_size(c, "num_hidden_layers"),
        vocab=_size(c, "vocab_size"), elem=DTYPE_BYTES.get(dt.lower(), 2),
    )


def _rw(read: int, write: int) -> dict[str, int]:
    return {"read_bytes": int(read), "write_bytes": int(write), "min_bytes": int(read + write)}


def op_min_bytes(
    s: Shape, op: str, tokens: int = 1, *, proj: str | None = None,
    batch: int | None = None, context: int | None = None,
) -> dict[str, int]:
    """Minimum read/write bytes of one call of `op` over `tokens` rows.

    op: gemm (with proj qkv|o|gate_up|down|lm_head), lm_head, norm, add_norm, rope, kv_write,
    silu_mul, embedding, argmax, attn_prefill (tokens = one sequence's length, times `batch`
    sequences), attn_decode (batch sequences × context cached tokens; tokens ignored).
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
        attn = ("attn_decode", dict(batch=batch, context=context), t)
    else:
        attn = ("attn_prefill", dict(batch=batch), context)
    plan: list[tuple[str, str | None, int, int, dict]] = [
        # op, proj, calls, tokens, extra; an op's class is the class table's (min_ops)
        ("embedding", None, 1, t, {}),
        ("norm", None, 1, t, {}),
        ("add_norm", None, 2 * L, t, {}),  # 2 per layer minus layer 0's first, + final
        ("gemm", "qkv", L, t, {}),
        ("rope", None, L, t, {}),
        ("kv_write", None, L, t, {}),
        (attn[0], None, L, attn[2], attn[1]),
        ("gemm", "o", L, t, {}),
        ("gemm", "gate_up", L, t, {}),
        ("silu_mul", None, L, t, {}),
        ("gemm", "down", L, t, {}),
        ("gemm", "lm_head", 1, rows_sampled, {}),
        ("argmax", None, 1, rows_sampled, {}),
    ]
    out = []
    for op, proj, calls, tokens, extra in plan:
        m = op_min_bytes(s, op, tokens, proj=proj, **extra)
        cls = CLASS_OF_OP[op]
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


def step_min_bytes(card: dict | str | Path, batch: int = 1, context: int = 2048,
                   phase: str = "decode") -> int:
    """Total theoretical minimum HBM bytes of one step."""
    return sum(r["min_bytes"] for r in step_rows(card, batch, context, phase))
