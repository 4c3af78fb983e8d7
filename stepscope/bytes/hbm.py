"""Peak HBM bandwidth per GPU, for the bandwidth floor `bytes / peak`.

The trace's own figure (nsys `TARGET_INFO_GPU.memoryBandwidth`) wins when present; this table
is the documented fallback. Values are the vendor datasheet peaks in bytes per second
(decimal: 1 TB/s = 1e12 B/s):

| GPU            | peak HBM B/s | source                                   |
|----------------|--------------|------------------------------------------|
| H100 SXM5 80GB | 3.35e12      | NVIDIA H100 datasheet (HBM3)             |
| H100 PCIe 80GB | 2.0e12       | NVIDIA H100 datasheet (HBM2e)            |
| H200 (SXM/NVL) | 4.8e12       | NVIDIA H200 datasheet (HBM3e, 141 GB)    |
| A100 80GB SXM  | 2.039e12     | NVIDIA A100 datasheet (HBM2e)            |
| A100 40GB      | 1.555e12     | NVIDIA A100 datasheet (HBM2)             |
| L40S           | 0.864e12     | NVIDIA L40S datasheet (GDDR6, not HBM)   |
"""

from __future__ import annotations

import re

# (pattern over the lower-cased device name, peak bytes/s, canonical name). First match wins,
# so the more specific patterns come first. "X.*Y" is anchored after the first X: searched
# unanchored, it is retried from every X of a long name (a trace's device name can be anything).
_TABLE: list[tuple[str, float, str]] = [
    (r"h200", 4.8e12, "H200"),
    (r"^(?:(?!h100).)*h100.*pcie", 2.0e12, "H100 PCIe"),
    (r"h100", 3.35e12, "H100 SXM"),
    (r"^(?:(?!a100).)*a100.*(80\s*gb|80g)", 2.039e12, "A100-80GB"),
    (r"^(?:(?!a100).)*a100.*(40\s*gb|40g)", 1.555e12, "A100-40GB"),
    (r"a100", 2.039e12, "A100-80GB"),  # unnamed memory size: the common SXM 80GB part
    (r"l40s", 0.864e12, "L40S"),
]

PEAK_HBM_BPS: dict[str, float] = {name: bps for _, bps, name in _TABLE}


def canonical_gpu(name: str | None) -> str | None:
    """'NVIDIA H200' -> 'H200'; None when the GPU is not in the table."""
    if not name:
        return None
    low = name.lower()
    for pat, _, canon in _TABLE:
        if re.search(pat, low):
            return canon
    return None


def peak_hbm_bps(name: str | None) -> float | None:
    """Peak HBM bandwidth in bytes/s for a device name as nsys/ncu/torch print it, else None."""
    canon = canonical_gpu(name)
    return PEAK_HBM_BPS[canon] if canon else None


def same_gpu(a: str | None, b: str | None) -> bool:
    """Whether two device names denote the same GPU model (by table entry, else by text)."""
    if not a or not b:
        return True  # unknown on one side: nothing to contradict
    ca, cb = canonical_gpu(a), canonical_gpu(b)
    if ca and cb:
        return ca == cb
    return a.strip().lower() == b.strip().lower()
