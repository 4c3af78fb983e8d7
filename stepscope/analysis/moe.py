"""Mixture-of-experts steps: the class names their kernels carry, and how many distinct experts a
step's tokens are expected to reach.

The kernel classes of an MoE layer come from the classification table (stepscope/data/rules.toml
and its class table); the names the rest of stepscope reads are the constants below, in this one
place, so that they follow that table. A trace classified before those classes existed (their
kernels `other`, the router's top-k `sampling`) still reads: a class no kernel has holds no time.

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


# Expert-GEMM kernels by name, read only where a trace's classes have no MOE_GEMM (classified by
# rules older than the MoE classes: `fused_moe_kernel` was `other`).
EXPERT_GEMM_NAMES = r"fused_moe_kernel|fused_moe|cutlass_moe|moe_gemm|grouped_gemm|marlin_moe|MoeGemm|moe_mm"

# Routing and token-movement kernels by name, likewise (torch.topk's gatherTopK is left out: the
# router's and the sampler's are told apart by their place in the step, not by name).
ROUTING_NAMES = (r"topkGating|topk_softmax|grouped_topk|moe_align_block_size|count_and_sort_expert_tokens|"
                 r"moe_sum|moe_permute|moe_unpermute|expand_and_permute|shuffle_rows")

# What `stepscope tp` assumes of an MoE step (analysis/tp.py), in words.
TP_ASSUMPTION = ("TP shards attention, the dense GEMMs and each expert's intermediate dimension (vLLM's default, "
                 "without --enable-expert-parallel): the experts' GEMMs divide by the width like a dense GEMM, "
                 "the routing (router top-k, align/sort, moe_sum) runs whole on every rank; with "
                 "--enable-expert-parallel the experts split across the GPUs instead (E/w each, whole): under "
                 "uniform routing each GPU's expected share of the expert work is the same 1/w, but the step waits "
                 "for the GPU whose experts drew the most tokens, which this projection does not model")


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
