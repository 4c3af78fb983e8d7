"""Which steps a command reports: the `--steps` option, one grammar for every command."""

from __future__ import annotations

from stepscope.errors import InputError

STEPS_HELP = "which steps: all, first, N, N-M or a comma list"


def _wanted(spec: str) -> set[int]:
    want: set[int] = set()
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise InputError(f"--steps takes all, first, N, N-M or a comma list, not {spec!r}")
        want.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return want


def check_steps(spec: str | int | None) -> None:
    """Raise InputError when `spec` is not in the grammar (before any trace is read)."""
    if spec not in (None, "", "all", "first"):
        _wanted(str(spec))


def parse_steps(spec: str | int | None, ids: list[int]) -> list[int]:
    """`all`, `first`, `N`, `N-M`, or a comma list of those → the step ids present in the trace."""
    if spec in (None, "", "all"):
        return list(ids)
    if spec == "first":
        return ids[:1]
    want = _wanted(str(spec))
    out = [i for i in ids if i in want]
    if not out:
        raise InputError(f"no step {spec} in this trace (it has steps {ids[0]}–{ids[-1]})" if ids
                         else f"no step {spec}: this trace has no steps")
    return out
