"""Which steps a command reports: the `--steps` option, one grammar for every command."""

from __future__ import annotations

import bisect
import re

from stepscope.errors import InputError

STEPS_HELP = "which steps: all, first, N, N-M or a comma list"

# ASCII digits only: str.isdigit() also takes '²' and '٣', which int() then refuses or reads
# as another number; 18 digits keep an index an int64 (and below Python's int-parsing limit)
_INDEX = re.compile(r"[0-9]{1,18}", re.ASCII)


def is_index(text: str) -> bool:
    """Whether `text` is a step index (or width) in ASCII digits that fits 64 bits."""
    return bool(_INDEX.fullmatch(text))


def _ranges(spec: str) -> list[tuple[int, int]]:
    """The spec as sorted, merged (lo, hi) ranges: a range is never expanded into its members
    (0-99999999 is two numbers, not a set of 10^8)."""
    out: list[tuple[int, int]] = []
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not _INDEX.fullmatch(lo) or (sep and not _INDEX.fullmatch(hi)):
            raise InputError(f"--steps takes all, first, N, N-M or a comma list of ASCII step numbers, "
                             f"not {spec[:80]!r}")
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise InputError(f"--steps {part.strip()}: a range runs upwards (N-M with N ≤ M)")
        out.append((a, b))
    out.sort()
    merged: list[tuple[int, int]] = []
    for a, b in out:
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def check_steps(spec: str | int | None) -> None:
    """Raise InputError when `spec` is not in the grammar (before any trace is read)."""
    if spec not in (None, "", "all", "first"):
        _ranges(str(spec))


def parse_steps(spec: str | int | None, ids: list[int]) -> list[int]:
    """`all`, `first`, `N`, `N-M`, or a comma list of those → the step ids present in the trace."""
    if spec in (None, "", "all"):
        return list(ids)
    if spec == "first":
        return ids[:1]
    ranges = _ranges(str(spec))
    starts = [a for a, _ in ranges]

    def wanted(i: int) -> bool:
        j = bisect.bisect_right(starts, i) - 1
        return j >= 0 and i <= ranges[j][1]

    out = [i for i in ids if wanted(i)]
    if not out:
        shown = spec if len(str(spec)) <= 80 else f"{str(spec)[:80]}…"
        raise InputError(f"no step {shown} in this trace (it has steps {ids[0]}–{ids[-1]})" if ids
                         else f"no step {shown}: this trace has no steps")
    return out
