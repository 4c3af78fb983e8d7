"""Layers of a step: the repeat period of its per-layer kernel pattern and its repeat count."""

from __future__ import annotations

import re

from stepscope.analysis.lazy_numpy import np


# Kernels of two streams inside one layer (a shared expert beside the routed ones, DeepSeek's and
# Qwen2-MoE's; the router's top-k beside a split-K reduce) start on the GPU in either order from one
# layer to the next, most of all inside a CUDA-graph replay: one such swap breaks seq[i] == seq[i+p]
# at a few places per neighbouring layer, and the longest exact run then ends at the swap (a
# 27-layer DeepSeek-V2-Lite decode step read as 2 layers of 252 kernels, its breaks 2 and 5 kernels
# long). Breaks of at most a quarter layer and at most MAX_BREAK kernels between runs of the same
# period are bridged (none below 4 kernels a layer: a short period is a pattern of its own), and the
# stretch counts its matches, not its span: a wrong period's scattered matches stay few. The cap
# keeps a multiple of the layer period from bridging a whole layer that differs (a decoder layer
# is 10–60 kernels).
MAX_BREAK = 6


def _longest_bridged_run(mask: np.ndarray, max_gap: int) -> tuple[int, int]:
    """(start, matches) of the stretch of `mask` with the most True values among the stretches
    whose breaks (runs of False) are at most `max_gap` long. Without a break: the longest run."""
    if not mask.any():
        return 0, 0
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts, ends = edges[::2], edges[1::2]
    # a new stretch begins where the break before a run is longer than max_gap
    new = np.concatenate(([True], starts[1:] - ends[:-1] > max_gap))
    matches = np.add.reduceat(ends - starts, np.flatnonzero(new))
    i = int(np.argmax(matches))
    return int(starts[new][i]), int(matches[i])


def detect_layers(seq: np.ndarray, max_period: int = 512) -> tuple[int | None, int | None]:
    """(layers, kernels_per_layer) of a kernel-name sequence, or (None, None) without repeats
    (layer_pattern's first two figures)."""
    layers, period, _ = layer_pattern(seq, max_period)
    return layers, period


def layer_pattern(seq: np.ndarray, max_period: int = 512) -> tuple[int | None, int | None, int | None]:
    """(layers, kernels_per_layer, start) of a kernel-name sequence, or (None, None, None).

    The period p is the one whose longest run of seq[i] == seq[i+p] covers the most kernels
    (the smallest such p within 10%), a run bridging breaks of up to a quarter layer and
    MAX_BREAK kernels (two streams' kernels swapped in one layer) and counting its matches. The layer count is then taken from kernels that occur
    exactly once per period (attention, RoPE, ...): the most common total count among them.
    That tolerates a first or last layer that differs in one kernel (e.g. a plain RMSNorm in
    layer 0 where later layers run the fused add+RMSNorm). `start` is where that longest run
    begins: seq[start + i] sits at position i % p of its layer.
    """
    n = len(seq)
    if n < 4 or np.unique(seq).size == n:  # no kernel name repeats: no period
        return None, None, None
    cover = []
    for p in range(1, min(n // 2, max_period) + 1):
        start, run = _longest_bridged_run(seq[:-p] == seq[p:], min(p // 4, MAX_BREAK))
        repeats = (run + p) // p if run >= p else 0
        cover.append((repeats * p if repeats >= 2 else 0, p, start))
    best = max(c for c, _, _ in cover)
    if best == 0:
        return None, None, None
    # a layer has more than one distinct kernel: a run of one repeated kernel is no layer
    candidates = [c for c in cover if c[0] >= 0.9 * best and len(np.unique(seq[c[2]:c[2] + c[1]])) > 1]
    if not candidates:
        return None, None, None
    _, p, start = candidates[0]
    window = seq[start:start + p]
    keys, counts = np.unique(window, return_counts=True)
    once = keys[counts == 1]
    if len(once) == 0:
        return max(2, best // p), p, start
    totals = np.array([(seq == k).sum() for k in once])
    vals, freq = np.unique(totals, return_counts=True)
    layers = int(vals[freq == freq.max()].max())
    return (layers, p, start) if layers >= 2 else (None, None, None)


# torch.compile numbers each generated kernel (triton_red_fused_..._rsqrt_11, ..._rsqrt_13):
# layers that run the same code get different numbers when Inductor emits one kernel per call
# site, so the layer pattern compares Triton kernels by their name without that number.
_TRITON_NUMBER = re.compile(r"^(triton_[a-z]+_fused\w*?)_\d+$")


def layer_keys(names: dict[int, str]) -> dict[int, int]:
    """{name id: id of its layer-pattern key} for the names that compare by a shorter key
    (Inductor's numbered kernels: the smallest id of the names sharing the unnumbered name)."""
    stems: dict[str, int] = {}
    out: dict[int, int] = {}
    for i, name in sorted(names.items()):
        m = _TRITON_NUMBER.match(name or "")
        if m:
            out[i] = stems.setdefault(m.group(1), i)
    return {i: k for i, k in out.items() if i != k}
