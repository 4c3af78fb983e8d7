"""Layers of a step: the repeat period of its per-layer kernel pattern and its repeat count."""

from __future__ import annotations

import re

from stepscope.analysis.lazy_numpy import np


def _longest_true_run(mask: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of True."""
    if not mask.any():
        return 0, 0
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts, ends = edges[::2], edges[1::2]
    i = int(np.argmax(ends - starts))
    return int(starts[i]), int(ends[i] - starts[i])


def detect_layers(seq: np.ndarray, max_period: int = 512) -> tuple[int | None, int | None]:
    """(layers, kernels_per_layer) of a kernel-name sequence, or (None, None) without repeats
    (layer_pattern's first two figures)."""
    layers, period, _ = layer_pattern(seq, max_period)
    return layers, period


def layer_pattern(seq: np.ndarray, max_period: int = 512) -> tuple[int | None, int | None, int | None]:
    """(layers, kernels_per_layer, start) of a kernel-name sequence, or (None, None, None).

    The period p is the one whose longest run of seq[i] == seq[i+p] covers the most kernels
    (the smallest such p within 10%). The layer count is then taken from kernels that occur
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
        start, run = _longest_true_run(seq[:-p] == seq[p:])
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
