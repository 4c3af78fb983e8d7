"""Mixture-of-experts steps: the class names their kernels carry, and how many distinct experts a
step's tokens are expected to reach.

The kernel classes of an MoE layer come from the classification table (stepscope/data/rules.toml
and its class table); the names the rest of stepscope reads are the constants below, in this one
place, so that they follow that table.

An MoE layer in vLLM (Qwen3-MoE, DeepSeek, Mixtral on the Triton backend, fixtures/models/):
router GEMM (hidden → experts, an ordinary cuBLAS GEMM) → top-k of the router logits
(`topkGating`, or torch.topk's `gatherTopK` after a softmax) → align and sort the tokens by
expert (`moe_align_block_size_kernel`, `count_and_sort_expert_tokens_kernel`) → the experts'
gate_up GEMM (`fused_moe_kernel`) → SiLU·mul (`act_and_mul_kernel`) → the experts' down GEMM
(`fused_moe_kernel`) → the weighted sum of each token's k outputs (`moe_sum_vec_kernel`), with the
shared experts (DeepSeek, Qwen2-MoE) a dense MLP beside them, often on a second stream.
"""

from __future__ import annotations

# the expert GEMMs (fused_moe_kernel, CUTLASS/DeepGEMM grouped GEMMs, Marlin MoE, ...)
MOE_GEMM = "moe_gemm"
# routing and token movement (top-k gating, align/sort, permute/unpermute, moe_sum)
MOE_ROUTING = "moe_routing"
# activation quantization (FP8 per-token/per-tensor quant kernels)
QUANTIZATION = "quantization"


def ep_slowest_share(experts: int, top_k: int, tokens: int, width: int) -> float:
    """Under expert parallelism over `width` GPUs (each holding E/w whole experts, the last ones
    fewer when w does not divide E): the expected share of the step's reached experts that the
    GPU holding the most of them holds — its expert GEMMs read those experts' weights, and the
    step waits for it. Uniform routing with each expert reached independently, with probability
    q = 1 − (1 − k/E)^T; a GPU's count is then Binomial(E/w, q) and the expected maximum over the
    w GPUs is Σ_x (1 − F(x)^w). 1 at one GPU; 1/w once every expert is reached (a long prefill);
    above 1/w in decode, where few experts are reached and one GPU may hold many of them."""
    from math import ceil, comb

    if width <= 1:
        return 1.0
    total = expected_distinct_experts(experts, top_k, tokens)
    if total <= 0:
        return 1.0 / width
    q = total / experts
    n = ceil(experts / width)
    pmf = [comb(n, x) * q ** x * (1 - q) ** (n - x) for x in range(n + 1)]
    cdf, acc = [], 0.0
    for p in pmf:
        acc += p
        cdf.append(min(acc, 1.0))
    exp_max = sum(1.0 - cdf[x] ** width for x in range(n))
    return min(1.0, max(exp_max / total, 1.0 / width))


# What `stepscope tp` assumes of an MoE step (analysis/tp.py), in words.
TP_ASSUMPTION = ("TP shards attention, the dense GEMMs and each expert's intermediate dimension (vLLM's default, "
                 "without --enable-expert-parallel): the experts' GEMMs divide by the width like a dense GEMM, "
                 "the routing (router top-k, align/sort, moe_sum) runs whole on every rank; with "
                 "--enable-expert-parallel the experts split across the GPUs instead (E/w each, whole): under "
                 "uniform routing each GPU's expected share of the expert work is the same 1/w, but the step waits "
                 "for the GPU whose experts drew the most tokens (tp --expert-parallel --model M projects that)")
EP_ASSUMPTION = ("expert parallelism (--enable-expert-parallel): attention and the dense GEMMs TP-sharded, the "
                 "experts split across the GPUs whole (E/w each); the expert GEMMs at width w take the share of "
                 "the step's reached experts that the busiest GPU holds, expected under uniform routing (each "
                 "expert reached independently, q = 1−(1−k/E)^T); the routing runs whole on every rank")


def expected_distinct_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts `tokens` tokens route to, each choosing `top_k` of
    `experts` under uniform routing (every expert equally likely, a token's k experts distinct,
    tokens independent): E·(1 − (1 − k/E)^T). One token reaches exactly k; many reach all E."""
    if experts <= 0 or top_k <= 0 or tokens <= 0:
        return 0.0
    k = min(top_k, experts)
    return experts * (1.0 - (1.0 - k / experts) ** tokens)


ROUTING_ASSUMPTION = ("uniform routing: each token's top-k experts equally likely and distinct, tokens "
                      "independent, so T tokens reach E·(1−(1−k/E)^T) distinct experts per MoE layer "
                      "(a skewed router reaches fewer, and moves fewer weight bytes: measured below this "
                      "minimum then means routing, not a faster kernel)")
