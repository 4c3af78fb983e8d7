"""The fifth H200 round (fixtures/round5, fixtures/vllm): steps, phases and classes that the
trace's names do not give away, each checked against plain SQL over the same export."""

from __future__ import annotations

import polars as pl

from stepscope.api import open_trace
from tests.conftest import FIXTURES, need, ro

R5 = FIXTURES / "round5"
VLLM = FIXTURES / "vllm"


def _count(path, where: str) -> int:
    return ro(path).execute(f"""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                JOIN StringIds s ON s.id = k.shortName WHERE {where}""").fetchone()[0]


def test_compiled_step_has_its_eight_layers():
    """torch.compile numbers its kernels per call site (..._rsqrt_11, _12, _13, _14 for the norms
    of alternating layers): compared without the number, the 8-layer step repeats every layer.
    Hand check: one cuDNN SDPA kernel per layer, and 147 kernels = 8 layers x 18 + the final
    norm, the LM head and the argmax."""
    path = need(R5 / "llama8b_decode_compiled_l8.sqlite")
    s = open_trace(path).steps[0]
    per_layer = _count(path, "s.value LIKE 'cudnn_generated_fort_native_sdpa%'")
    assert s.layers == per_layer == 8
    assert s.kernels_per_layer == 18
    tail = _count(path, "s.value IN ('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_15', "
                        "'nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT', 'triton_red_fused_argmax_16')")
    assert s.n_kernels == s.layers * s.kernels_per_layer + tail == 147
