"""The ops of one Llama decoder step, named the way vLLM's kernels are named.

The analyzer classifies kernels by name (docs/KERNEL_CLASSES.md). vLLM's fused custom ops have
descriptive names (`rms_norm_kernel`, `fused_add_rms_norm_kernel`, `rotary_embedding_kernel`,
`reshape_and_cache_kernel`, `act_and_mul_kernel`), so on CUDA, when Triton is importable, the
light ops run as small Triton kernels with exactly those function names: one launch each, like
vLLM. Elsewhere (CPU, no Triton) they fall back to plain torch, which gives the same numbers.
GEMMs go through `F.linear` (cuBLASLt), attention through `scaled_dot_product_attention`
(FlashAttention / cuDNN / efficient kernels), embedding through `F.embedding` and sampling
through `torch.argmax`: those already carry recognisable names.

Backend choice: `STEPSCOPE_OPS=torch` forces the torch fallbacks; `STEPSCOPE_OPS=triton` forces
Triton even on CPU tensors (only meaningful with `TRITON_INTERPRET=1`, used by the tests).

Layouts (vLLM's):
- activations are 2-D `[tokens, features]`; q is `[T, Hq*D]`, k `[T, Hkv*D]` (views of the
  fused QKV output are fine: only the last dimension must be contiguous);
- `cos_sin_cache` is `[max_pos, D]`: cos in the first D/2 columns, sin in the last D/2;
  rotary is NeoX style (rotate the two halves of each head);
- the KV cache is `[num_slots, Hkv, D]` (any shape whose rows are slots works); for the
  attention functions it is viewed as `[batch, slots_per_seq, Hkv, D]`, slot = b*slots + pos.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:  # Triton is optional: CPU boxes and CI run the torch fallbacks.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False


# Set by the engine (`--ops`, and `--mode compiled`, which needs the plain torch ops for
# Inductor to fuse): a module constant rather than the environment, because torch.compile
# traces use_triton() and reading os.environ there would be a guard on every call.
BACKEND: str | None = None


def set_backend(name: str | None) -> None:
    """Force `torch` or `triton` light ops for this process (None: the environment decides)."""
    global BACKEND
    if name not in (None, "auto", "torch", "triton"):
        raise ValueError(f"unknown ops backend {name!r}: auto, torch or triton")
    BACKEND = None if name == "auto" else name


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernel runs for tensor `t` (see module docstring)."""
    mode = BACKEND or os.environ.get("STEPSCOPE_OPS", "auto").lower()
    if mode == "torch" or not HAS_TRITON:
        return False
    if mode == "triton":
        return True
    return t.is_cuda


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _warps(block: int) -> int:
    return 4 if block <= 1024 else (8 if block <= 4096 else 16)


# ---------------------------------------------------------------------------------------
# Triton kernels. Function names are what nsys records as the kernel name.
# ---------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, n_cols, eps,
                        BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        var = tl.sum(x * x, axis=0) / n_cols
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w
        tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def fused_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, stride_x,
                                  stride_res, stride_out, stride_new_res, n_cols, eps,
                                  BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        s = x + r
        s_rounded = s.to(new_res_ptr.dtype.element_ty)
        tl.store(new_res_ptr + row * stride_new_res + cols, s_rounded, mask=mask)
        s = s_rounded.to(tl.float32)  # normalise what was stored, as vLLM does
        var = tl.sum(s * s, axis=0) / n_cols
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = s * rstd * w
        tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def rotary_embedding_kernel(pos_ptr, q_ptr, k_ptr, cache_ptr, stride_q, stride_k,
                                stride_cache, n_q_heads, n_k_heads,
                                HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                                BLOCK_D: tl.constexpr):
        tok = tl.program_id(0)
        pos = tl.load(pos_ptr + tok)
        d = tl.arange(0, BLOCK_D)
        dmask = d < HALF
        cos = tl.load(cache_ptr + pos * stride_cache + d, mask=dmask, other=0.0).to(tl.float32)
        sin = tl.load(cache_ptr + pos * stride_cache + HALF + d, mask=dmask,
                      other=0.0).to(tl.float32)
        h = tl.arange(0, BLOCK_H)
        # q heads
        qmask = (h[:, None] < n_q_heads) & dmask[None, :]
        q_off = q_ptr + tok * stride_q + h[:, None] * (2 * HALF) + d[None, :]
        q1 = tl.load(q_off, mask=qmask, other=0.0).to(tl.float32)
        q2 = tl.load(q_off + HALF, mask=qmask, other=0.0).to(tl.float32)
        tl.store(q_off, (q1 * cos[None, :] - q2 * sin[None, :]).to(q_ptr.dtype.element_ty),
                 mask=qmask)
        tl.store(q_off + HALF,
                 (q2 * cos[None, :] + q1 * sin[None, :]).to(q_ptr.dtype.element_ty), mask=qmask)
        # k heads
        kmask = (h[:, None] < n_k_heads) & dmask[None, :]
        k_off = k_ptr + tok * stride_k + h[:, None] * (2 * HALF) + d[None, :]
        k1 = tl.load(k_off, mask=kmask, other=0.0).to(tl.float32)
        k2 = tl.load(k_off + HALF, mask=kmask, other=0.0).to(tl.float32)
        tl.store(k_off, (k1 * cos[None, :] - k2 * sin[None, :]).to(k_ptr.dtype.element_ty),
                 mask=kmask)
        tl.store(k_off + HALF,
                 (k2 * cos[None, :] + k1 * sin[None, :]).to(k_ptr.dtype.element_ty), mask=kmask)

    @triton.jit
    def reshape_and_cache_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_k, stride_v,
                                 stride_kc, stride_vc, n_cols, BLOCK: tl.constexpr):
        tok = tl.program_id(0)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        k = tl.load(k_ptr + tok * stride_k + cols, mask=mask)
        v = tl.load(v_ptr + tok * stride_v + cols, mask=mask)
        tl.store(kc_ptr + slot * stride_kc + cols, k, mask=mask)
        tl.store(vc_ptr + slot * stride_vc + cols, v, mask=mask)

    @triton.jit
    def act_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, d, BLOCK: tl.constexpr):
        tok = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < d
        a = tl.load(x_ptr + tok * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x_ptr + tok * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
        y = a / (1.0 + tl.exp(-a)) * b
        tl.store(out_ptr + tok * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------
# Public ops (imported by the ncu microbenchmarks: keep names and signatures).
# ---------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of a 2-D `[T, H]` tensor; returns a new tensor."""
    x2 = x.reshape(-1, x.shape[-1])
    if use_triton(x2):
        assert x2.stride(-1) == 1
        out = torch.empty((x2.shape[0], x2.shape[1]), dtype=x.dtype, device=x.device)
        n = x2.shape[1]
        block = _np2(n)
        rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0), n,
                                        float(eps), BLOCK=block, num_warps=_warps(block))
        return out.reshape(x.shape)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`new_residual = x + residual; out = rms_norm(new_residual)`; returns (out, new_residual).

    Out of place (vLLM updates x and residual in place; the bytes moved are the same).
    """
    if use_triton(x):
        x2 = x.reshape(-1, x.shape[-1])
        r2 = residual.reshape(-1, residual.shape[-1])
        assert x2.stride(-1) == 1 and r2.stride(-1) == 1
        out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        new_res = torch.empty(r2.shape, dtype=residual.dtype, device=x.device)
        n = x2.shape[1]
        block = _np2(n)
        fused_add_rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out, new_res, x2.stride(0), r2.stride(0), out.stride(0),
            new_res.stride(0), n, float(eps), BLOCK=block, num_warps=_warps(block))
        return out.reshape(x.shape), new_res.reshape(residual.shape)
    new_res = (x.float() + residual.float()).to(residual.dtype)
    return rms_norm(new_res, weight, eps), new_res


def make_cos_sin_cache(head_dim: int, max_pos: int, theta: float,
                       dtype: torch.dtype = torch.float32,
                       device: torch.device | str = "cpu") -> torch.Tensor:
    """`[max_pos, head_dim]`: cos of each rotary frequency, then sin (vLLM's layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    t = torch.arange(max_pos, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype=dtype, device=device)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX-style RoPE applied in place to q `[T, Hq*D]` and k `[T, Hkv*D]`; returns (q, k)."""
    head_dim = cos_sin_cache.shape[-1]
    half = head_dim // 2
    n_tok = positions.shape[0]
    hq = q.shape[-1] // head_dim
    hk = k.shape[-1] // head_dim
    if use_triton(q):
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
        block_h = _np2(max(hq, hk))
        rotary_embedding_kernel[(n_tok,)](
            positions, q, k, cos_sin_cache, q.stride(0), k.stride(0), cos_sin_cache.stride(0),
            hq, hk, HALF=half, BLOCK_H=block_h, BLOCK_D=_np2(half), num_warps=4)
        return q, k
    cs = cos_sin_cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    for t, h in ((q, hq), (k, hk)):
        v = t.view(n_tok, h, head_dim).float()
        a, b = v[..., :half], v[..., half:]
        rotated = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        t.view(n_tok, h, head_dim).copy_(rotated.to(t.dtype))
    return q, k


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write k, v `[T, Hkv*D]` into row `slot_mapping[t]` of the caches (rows = slots)."""
    n_tok, n_cols = k.shape[0], k.shape[-1]
    kc = k_cache.view(-1, n_cols)
    vc = v_cache.view(-1, n_cols)
    if use_triton(k):
        assert k.stride(-1) == 1 and v.stride(-1) == 1
        block = min(_np2(n_cols), 1024)
        grid = (n_tok, triton.cdiv(n_cols, block))
        reshape_and_cache_kernel[grid](k, v, kc, vc, slot_mapping, k.stride(0), v.stride(0),
                                       kc.stride(0), vc.stride(0), n_cols, BLOCK=block,
                                       num_warps=4)
        return
    idx = slot_mapping.long()
    kc.index_copy_(0, idx, k.reshape(n_tok, n_cols).to(kc.dtype))
    vc.index_copy_(0, idx, v.reshape(n_tok, n_cols).to(vc.dtype))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: `silu(x[:, :d]) * x[:, d:]` for x `[T, 2d]`."""
    d = x.shape[-1] // 2
    if use_triton(x):
        x2 = x.reshape(-1, x.shape[-1])
        assert x2.stride(-1) == 1
        out = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
        block = min(_np2(d), 1024)
        act_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, out, x2.stride(0), out.stride(0), d, BLOCK=block, num_warps=4)
        return out.reshape(*x.shape[:-1], d)
    a = x[..., :d].float()
    return (F.silu(a) * x[..., d:].float()).to(x.dtype)


try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _FUSED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                       SDPBackend.EFFICIENT_ATTENTION]
except Exception:  # pragma: no cover - old torch
    sdpa_kernel = None  # type: ignore[assignment]
    _FUSED_BACKENDS = []

# Whether a fused SDPA kernel accepts GQA directly on this torch/GPU (decided on first use,
# i.e. during warm-up, never inside a CUDA-graph capture).
_NATIVE_GQA: bool | None = None


def _repeat_kv(q, k, v):
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _sdpa(q, k, v, causal: bool):
    """SDPA over `[B, H, S, D]` tensors, with GQA (fewer K/V heads than query heads).

    On CUDA, GQA goes to a fused kernel (`enable_gqa=True` under FlashAttention / cuDNN /
    efficient attention, never the unfused math path, whose softmax kernel is not attention);
    when none accepts it, K/V heads are repeated (extra copy kernels) and MHA is used.
    """
    global _NATIVE_GQA
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if q.is_cuda and sdpa_kernel is not None and _NATIVE_GQA is not False:
        try:
            with sdpa_kernel(_FUSED_BACKENDS):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            _NATIVE_GQA = True
            return out
        except (RuntimeError, TypeError):
            _NATIVE_GQA = False
    if not q.is_cuda:
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:  # torch < 2.5
            pass
    k, v = _repeat_kv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int,
                      num_kv_heads: int, head_dim: int, batch: int, seq_len: int) -> torch.Tensor:
    """Causal self-attention over `batch` prompts of `seq_len` tokens; q `[B*S, Hq*D]`,
    k/v `[B*S, Hkv*D]`; returns `[B*S, Hq*D]`."""
    qh = q.reshape(batch, seq_len, num_heads, head_dim).transpose(1, 2)
    kh = k.reshape(batch, seq_len, num_kv_heads, head_dim).transpose(1, 2)
    vh = v.reshape(batch, seq_len, num_kv_heads, head_dim).transpose(1, 2)
    out = _sdpa(qh, kh, vh, causal=True)
    return out.transpose(1, 2).reshape(batch * seq_len, num_heads * head_dim)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     context_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                     batch: int) -> torch.Tensor:
    """One new query token per sequence against the first `context_len` cached positions
    (the new token's K/V included); q `[B, Hq*D]`, caches `[B*slots, Hkv, D]`; returns
    `[B, Hq*D]`."""
    # GQA decode packs the query heads that share a KV head into the query-length dimension
    # (one query token attends to all cached positions, so no mask is involved): plain MHA
    # over `num_kv_heads` heads with `group` query rows, which every fused SDPA kernel takes.
    group = num_heads // num_kv_heads
    qh = q.reshape(batch, num_kv_heads, group, head_dim)
    kc = k_cache.view(batch, -1, num_kv_heads, head_dim)[:, :context_len].transpose(1, 2)
    vc = v_cache.view(batch, -1, num_kv_heads, head_dim)[:, :context_len].transpose(1, 2)
    out = F.scaled_dot_product_attention(qh, kc, vc, is_causal=False)
    return out.reshape(batch, num_heads * head_dim)


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, table)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ w.T` (+ bias) through `F.linear`: the cuBLASLt path; w is `[out, in]`."""
    return F.linear(x, w, bias)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)
