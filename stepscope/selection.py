"""Which steps a command reports: the `--steps` option, one grammar for every command.

A spec is a comma list of items, the union of what each selects (in step order):
- `all`, `first`, `last`; `N` (a step index) and `N-M` (a range, both ends included);
- `slowest`: the step of the largest step time; `top:N`: the N slowest (ties: the earlier step);
- `kind:<words>`: the steps whose serving kind label (composition.kind_expr, e.g.
  `mixed · piecewise · 17–32 reqs`) holds every given word, case-insensitive; words are
  separated by spaces, `·` or `+`, and `-` reads as the label's `–` (`kind:decode·full`,
  `kind:mixed`, `kind:decode 17-32`). The label starts with the phase, so `kind:prefill`
  selects by phase alone.
The figure-based items (`slowest`, `top:`, `kind:`) need the steps frame (Inventory.steps).
"""

from __future__ import annotations

import bisect
import re

from stepscope.errors import InputError

STEPS_HELP = ("which steps: all, first, last, N, N-M, slowest, top:N (the N slowest), kind:WORDS (steps "
              "whose kind, e.g. 'decode · full · 17–32 reqs', holds every word), or a comma list of those")

# ASCII digits only: str.isdigit() also takes '²' and '٣', which int() then refuses or reads
# as another number; 18 digits keep an index an int64 (and below Python's int-parsing limit)
_INDEX = re.compile(r"[0-9]{1,18}", re.ASCII)
_WORD_SPLIT = re.compile(r"[\s·+]+")
_GRAMMAR = "--steps takes all, first, last, N, N-M (ASCII step numbers), slowest, top:N, kind:WORDS or a comma list of those"


def is_index(text: str) -> bool:
    """Whether `text` is a step index (or width) in ASCII digits that fits 64 bits."""
    return bool(_INDEX.fullmatch(text))


def kind_words(text: str) -> list[str]:
    """The words of a kind label or of a `kind:` item: lower case, `-` read as `–`."""
    return [w for w in _WORD_SPLIT.split(text.strip().lower().replace("-", "–")) if w]


def _items(spec: str) -> tuple[list[tuple[int, int]], list[str], list[int], list[list[str]]]:
    """The spec's items: (merged index ranges, named items first/last/slowest, top:N counts,
    kind: word lists). A range is never expanded into its members (0-99999999 is two numbers,
    not a set of 10^8)."""
    out: list[tuple[int, int]] = []
    named: list[str] = []
    tops: list[int] = []
    kinds: list[list[str]] = []
    for part in spec.split(","):
        p = part.strip()
        low = p.lower()
        if low in ("all", "first", "last", "slowest"):
            named.append(low)
            continue
        if low.startswith("top:"):
            n = p[4:].strip()
            if not _INDEX.fullmatch(n) or int(n) == 0:
                raise InputError(f"--steps {p}: top:N takes a step count of 1 or more (top:3: the three slowest)")
            tops.append(int(n))
            continue
        if low.startswith("kind:"):
            words = kind_words(p[5:])
            if not words:
                raise InputError(f"--steps {p}: kind: takes the words of a step kind "
                                 "(kind:decode, kind:mixed, kind:decode·full)")
            kinds.append(words)
            continue
        lo, sep, hi = p.partition("-")
        if not _INDEX.fullmatch(lo) or (sep and not _INDEX.fullmatch(hi)):
            raise InputError(f"{_GRAMMAR}, not {spec[:80]!r}")
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise InputError(f"--steps {p}: a range runs upwards (N-M with N ≤ M)")
        out.append((a, b))
    out.sort()
    merged: list[tuple[int, int]] = []
    for a, b in out:
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged, named, tops, kinds


def _ranges(spec: str) -> list[tuple[int, int]]:
    return _items(spec)[0]


def check_steps(spec: str | int | None) -> None:
    """Raise InputError when `spec` is not in the grammar (before any trace is read)."""
    if spec not in (None, ""):
        _items(str(spec))


def _kind_labels(steps) -> list[tuple[int, str]]:
    """(step, its kind label) for every step of the frame (its phase alone in a frame without
    the composition columns)."""
    from stepscope.analysis.composition import kind_expr

    if "graph_mode" not in steps.columns or "requests" not in steps.columns:
        phases = steps["phase"].to_list() if "phase" in steps.columns else [None] * steps.height
        return [(int(i), str(p or "phase?")) for i, p in zip(steps["step"].to_list(), phases)]
    k = steps.select("step", kind_expr().alias("kind"))
    return list(zip((int(i) for i in k["step"].to_list()), k["kind"].to_list()))


def parse_steps(spec: str | int | None, steps) -> list[int]:
    """The step ids `spec` selects, in step order. `steps`: the steps frame (Inventory.steps:
    step, step_time_ns and the composition columns), or a list of step ids when the spec needs
    no step figures. An InputError when it selects none."""
    ids = sorted(int(i) for i in steps["step"].to_list()) if hasattr(steps, "columns") else list(steps)
    if spec in (None, "", "all"):
        return list(ids)
    ranges, named, tops, kinds = _items(str(spec))
    if "all" in named:
        return list(ids)
    if (tops or kinds or "slowest" in named) and not hasattr(steps, "columns"):
        raise TypeError("slowest, top:N and kind: select by step figures: pass the steps frame")
    chosen: set[int] = set()
    if ids and "first" in named:
        chosen.add(ids[0])
    if ids and "last" in named:
        chosen.add(ids[-1])
    if tops or "slowest" in named:
        n = max(tops + ([1] if "slowest" in named else []))
        order = steps.select("step", "step_time_ns").sort("step_time_ns", "step", descending=[True, False],
                                                           nulls_last=True)
        chosen.update(int(i) for i in order["step"].head(n).to_list())
    unmatched = []
    if kinds:
        labels = [(i, kind_words(t)) for i, t in _kind_labels(steps)]
        for words in kinds:
            hit = [i for i, lw in labels if all(w in lw for w in words)]
            if not hit:
                unmatched.append(" ".join(words))
            chosen.update(hit)
    starts = [a for a, _ in ranges]

    def wanted(i: int) -> bool:
        j = bisect.bisect_right(starts, i) - 1
        return j >= 0 and i <= ranges[j][1]

    out = [i for i in ids if i in chosen or (ranges and wanted(i))]
    if not out:
        shown = spec if len(str(spec)) <= 80 else f"{str(spec)[:80]}…"
        if unmatched and ids:
            present = sorted({t for _, t in _kind_labels(steps)})
            more = f"; and {len(present) - 8} more" if len(present) > 8 else ""
            raise InputError(f"no step of kind {unmatched[0]!r} in this trace (its kinds: "
                             f"{'; '.join(present[:8])}{more})")
        raise InputError(f"no step {shown} in this trace (it has steps {ids[0]}–{ids[-1]})" if ids
                         else f"no step {shown}: this trace has no steps")
    return out
