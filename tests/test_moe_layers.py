"""The layers of MoE and MLA steps (fixtures/models/, vLLM 0.26 on the H200): every step of the
Qwen3-30B-A3B run has its 48 layers and every step of the DeepSeek-V2-Lite run its 27 (the first
dense), though DeepSeek's shared experts run beside the routed ones and their kernels swap places
from one layer to the next. Counted again here in plain SQL: the kernels that run once per layer
(the KV-cache write) and twice per MoE layer (fused_moe_kernel) inside each step's GPU span."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from conftest import FIXTURES, gunzipped
from stepscope.analysis.layers import layer_pattern

MODELS = FIXTURES / "models"
CASES = {
    # fixture: (layers, MoE layers, the KV-cache write kernel)
    "qwen3-30b-a3b_r32_graph_plain": (48, 48, "reshape_and_cache_flash_kernel"),
    "deepseek-v2-lite_r32_graph_plain": (27, 26, "concat_and_cache_mla_kernel"),
}


def _per_step(db: sqlite3.Connection, spans: list[tuple[int, int, int]], name: str) -> list[int]:
    """Kernels called `name` (short name) that start inside each (device, first start, last end)."""
    out = []
    for dev, a, b in spans:
        out.append(db.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "WHERE s.value = ? AND k.deviceId = ? AND k.start >= ? AND k.start <= ?", (name, dev, a, b)).fetchone()[0])
    return out


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_every_step_has_the_models_layers(fixture):
    from stepscope import library

    layers, moe_layers, kv_write = CASES[fixture]
    path = gunzipped(MODELS / f"{fixture}.sqlite.gz")
    inv = library.load(path)
    st = inv.steps.sort("step")
    assert st.height > 60
    assert set(st["layers"].to_list()) == {layers}, st.select("step", "layers", "kernels_per_layer").to_dicts()
    spans = list(zip(st["device"].to_list(), st["first_start"].to_list(), st["last_end"].to_list()))
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        assert _per_step(db, spans, kv_write) == [layers] * st.height
        assert _per_step(db, spans, "fused_moe_kernel") == [2 * moe_layers] * st.height


def test_a_swap_between_two_streams_does_not_end_the_layers():
    """A layer of 12 kernels whose last two swap places in some layers (a shared expert's GEMM and
    the router's top-k on two streams): 20 layers of 12."""
    layer = np.arange(1, 13)
    swapped = np.array([*range(1, 11), 12, 11])
    seq = np.concatenate([[90, 91]] + [swapped if i in (4, 11, 15) else layer for i in range(20)] + [[92]])
    n, p, _ = layer_pattern(seq)
    assert (n, p) == (20, 12)
    # a break longer than a quarter layer is no swap: there the exact run decides, as before
    other = np.arange(20, 32)
    long = np.concatenate([layer] * 6 + [other] + [layer] * 3)
    assert layer_pattern(long)[:2] == (9, 12)
