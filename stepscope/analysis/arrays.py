"""Array steps over rows grouped in contiguous runs (a step's launch calls, its activities),
for the figures that are recurrences rather than group-bys (the untraced replay): cumulative
sums and maxima that restart per group, and a search of sorted (group, time) pairs.

The maximum and the search offset each group into a value range of its own, so that one
vectorized numpy pass serves every group; the offsets are checked to fit int64 first.
"""

from __future__ import annotations

from stepscope.analysis.frames import fits_packed, pack_pair
from stepscope.analysis.lazy_numpy import np

KEY_BITS = 62  # an offset value stays a non-negative int64


def group_bounds(groups: np.ndarray) -> np.ndarray:
    """Start offsets of the runs of equal values in a sorted group array."""
    if groups.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))


def cumsum_within(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sum restarting at each group start (groups are contiguous runs)."""
    c = np.cumsum(x)
    before = np.concatenate(([0], c[:-1]))[starts]
    return c - np.repeat(before, np.diff(np.append(starts, x.size)))


def cummax_within(x: np.ndarray, groups: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative maximum of int64 `x` restarting per group, in place: each group's values are
    lifted above every earlier group's, one accumulate runs, the lift is taken off again (a
    group loop when the lifted values would not fit int64)."""
    if not x.size:
        return x
    lo, hi = int(x.min()), int(x.max())
    span = hi - lo + 1
    if fits_packed(span, int(groups.max())):
        shift = groups.astype(np.int64) * span
        x -= lo
        x += shift
        np.maximum.accumulate(x, out=x)
        x -= shift
        x += lo
        return x
    ends = np.append(starts[1:], x.size)
    for a, b in zip(starts, ends):  # pragma: no cover - a trace spanning more than int64 allows
        np.maximum.accumulate(x[a:b], out=x[a:b])
    return x


def last_at_or_before(groups: np.ndarray, times: np.ndarray, q_groups: np.ndarray,
                      q_times: np.ndarray) -> np.ndarray | None:
    """Per query (q_group, q_time): the index of the last (group, time) pair at or before it,
    the pairs sorted by group then time (-1 when none); None when the pairs do not pack into
    one int64 (group above the time's bits)."""
    if not times.size or not q_times.size:
        return np.full(q_times.size, -1, dtype=np.int64)
    base = min(int(times.min()), int(q_times.min()))
    span = max(int(times.max()), int(q_times.max())) - base + 1
    width = span.bit_length()
    top = max(int(groups.max()), int(q_groups.max()))
    if top < 0 or int(min(groups.min(), q_groups.min())) < 0 or width + top.bit_length() > KEY_BITS:
        return None
    key, q = pack_pair(groups, times, base, width), pack_pair(q_groups, q_times, base, width)
    return np.searchsorted(key, q, side="right") - 1
