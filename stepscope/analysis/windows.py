"""A long trace analyzed by windows of steps, so that memory does not grow with the run.

A window is a stretch of host time that holds a few of the trace's step ranges (its *own*
steps) and one step range of context on each side. Its events (the API calls that started in
it, the kernels and memops they launched, or that started in it when nothing launched them) form
a small trace of their own, analyzed by the same chain as a whole trace (analyze_trace,
calibration_free); of its steps only the own ones are kept, numbered where the whole trace
numbers them (steps are numbered by their range's start: DEFINITIONS.md). The context makes a
step's figures its own in the window exactly as in the whole trace: a step's begin waits for the
previous step's GPU work, a vLLM step runs to the next iteration's range, the host pauses and
gaps of a step lie within its step and its neighbours. What depends on every step (the what-if's
memset mode, the untraced estimate, the verdicts, the trace's own graph constants, the run view)
is computed once, over the windows' per-step frames, by the same functions (diagnose with
`known`).

Windows apply where the steps are NVTX step ranges of one device per process (vLLM's
`execute_context…` ranges, `--step-regex`): each step is then a range of host time that a window
can hold whole. Where they are not (the engine loop, capture ranges, periods, several devices per
process), `plan` says why and the trace is analyzed whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from stepscope.analysis.steps import _windows_nvtx
from stepscope.model import in_span as _in

# how many step ranges a window owns by default: a serving run's step is ~400 kernels, so a
# window holds ~1M kernels (a few hundred MB while it is analyzed)
WINDOW_STEPS = 2500


@dataclass(frozen=True)
class Window:
    """One window: own steps are those whose range starts in [own_lo, own_hi); events are read
    for host time [lo, hi) (one step range of context on each side)."""

    index: int
    own_lo: int | None
    own_hi: int | None
    lo: int | None
    hi: int | None
    ranges: tuple = ()  # (pid, how many step ranges of that process start in the own span)


@dataclass(frozen=True)
class Plan:
    windows: tuple[Window, ...]
    why_whole: str | None = None  # why the trace is analyzed whole (windows is then empty)


def step_ranges(nvtx: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    """The trace's NVTX step ranges (pid, tid, w_start, w_end, …): what windows are cut along."""
    return _windows_nvtx(nvtx, step_regex)


def plan(nvtx: pl.DataFrame, step_regex: str | None, window_steps: int = WINDOW_STEPS,
         ranges: pl.DataFrame | None = None) -> Plan:
    """The windows of a trace whose NVTX table is `nvtx`: every `window_steps` step ranges (in
    start order over every thread) a window boundary, at a range's start. `ranges`:
    step_ranges(nvtx, step_regex), when the caller has them."""
    w = step_ranges(nvtx, step_regex) if ranges is None else ranges
    if w.is_empty():
        return Plan((), "no NVTX step range: the steps are found from the whole trace")
    starts = w["w_start"].sort()
    n = starts.len()
    pid_starts = w.select(pl.col("pid").cast(pl.Int64), "w_start").sort("w_start")
    if n <= window_steps:
        return Plan((), "one window holds every step")
    cuts = [int(starts[i]) for i in range(window_steps, n, window_steps)]
    bounds = [None, *cuts, None]
    out = []
    for i in range(len(bounds) - 1):
        own_lo, own_hi = bounds[i], bounds[i + 1]
        # one step range of context before the own ones, two after (the last own step runs to
        # the next iteration's range, whose own step the context then holds whole)
        lo = None if own_lo is None else int(starts[max(starts.search_sorted(own_lo, "left") - 1, 0)])
        if own_hi is None:
            hi = None
        else:
            j = starts.search_sorted(own_hi, "left") + 2
            hi = None if j >= n else int(starts[j])
        mine = pid_starts.filter(_in("w_start", own_lo, own_hi)).group_by("pid").len().sort("pid")
        out.append(Window(i, own_lo, own_hi, lo, hi, tuple(mine.iter_rows())))
    return Plan(tuple(out))


def window_trace(trace, w: Window):
    """The trace of window `w`: the API calls that started in it, the kernels and memops they
    launched (or that started in it, launched by no call of the window), the NVTX ranges that
    overlap it; the rest of the trace (names, GPUs, threads) as it is."""
    api = trace.api.filter(_in("start", w.lo, w.hi))
    keys = api.select("pid", "corr").unique()

    def launched(f: pl.DataFrame) -> pl.DataFrame:
        mine = f.join(keys, on=["pid", "corr"], how="semi")
        loose = f.join(keys, on=["pid", "corr"], how="anti").filter(_in("start", w.lo, w.hi))
        return pl.concat([mine, loose]).sort("start", maintain_order=True) if loose.height else mine

    nv = trace.nvtx
    if w.lo is not None:
        nv = nv.filter(pl.col("end") >= w.lo)
    if w.hi is not None:
        nv = nv.filter(pl.col("start") < w.hi)
    sub = replace(trace, kernels=launched(trace.kernels), memops=launched(trace.memops), api=api, nvtx=nv,
                  warnings=[], cache_entry=None, cache_dir=None, reread=None)
    return sub


class WholeTrace(Exception):
    """The trace's steps cannot be analyzed by windows: the reason (the trace is analyzed whole)."""


def _owned(steps: pl.DataFrame, w: Window) -> pl.DataFrame:
    return steps.filter(_in("w_start", w.own_lo, w.own_hi)).select("step").sort("step")


def _renumbered(f: pl.DataFrame | None, ids: pl.DataFrame) -> pl.DataFrame | None:
    """`f`'s rows of the own steps `ids` (local ids), numbered 0.. in the window (combined()
    numbers them after the windows before)."""
    if f is None or "step" not in f.columns:
        return f
    m = ids.with_columns(_new=pl.int_range(pl.len(), dtype=pl.Int64))
    dtype = f.schema["step"]
    return (f.join(m, on="step", how="inner", maintain_order="left")
            .with_columns(pl.col("_new").cast(dtype).alias("step")).drop("_new"))


@dataclass
class _Parts:
    """The own steps' frames of the windows analyzed so far, by field name."""

    inv: dict
    known: dict
    class_by: list
    offset: int = 0


INV_STEP_FRAMES = ("steps", "classes", "kernels", "framework", "framework_ops", "graph_steps")


@dataclass
class Own:
    """What a window found of the whole trace's own figures beyond its steps: the counts and
    ends the trace's warnings and capture defects are made of, over the window's own share."""

    ranges: dict          # pid -> step ranges that start in the window's own span
    clock: dict           # clock_defect's counts and extremes over the kernels its own calls launched
    ends: pl.DataFrame    # pid, the end of its last CUDA record (API call, kernel or memop)
    api_end: int | None   # the end of the last API call
    gpu_pids: set
    kernels: int = 0      # the kernels that start in its own span (Inventory.kernel_total, the clock's n)
    # (pid, corr, start) of its activities that start in its own span and that no call of the
    # window launched, and of those its own calls launched that start in another window's span:
    # a launch-less activity is one of the first that is none of the second of any window
    loose: pl.DataFrame = None
    away: pl.DataFrame = None


@dataclass
class WindowResult:
    """One window analyzed: its own steps' frames (numbered 0..steps-1 in the window: combined()
    numbers them in the trace), what it found of the trace's warnings and defects (Own), its
    evidence by kind (Inventory.class_by_parts) and, for the first window, the start-up. Small
    frames only: what travels back from a dask worker."""

    index: int
    steps: int
    inv: dict
    known: dict
    own: Own
    class_by: tuple
    startup: pl.DataFrame | None


def analyze_window(trace, w: Window, step_regex, rules, launch_config=None) -> WindowResult:
    """Window `w`'s own steps analyzed (the trace `trace` is window_trace's for `w`)."""
    from stepscope.analysis.diagnosis import calibration_free, longest_gaps
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.analysis.steps import NoStep

    own_ranges = dict(w.ranges)
    try:
        inv = analyze_trace(trace, step_regex, rules, launch_config=launch_config, refuse=False)
    except NoStep:  # its ranges launched nothing (a window of one empty step range)
        return WindowResult(w.index, 0, {}, {}, _own_of(trace, None, w, own_ranges), (), None)
    if not (inv.steps["delimiter"] == "nvtx").all():
        raise WholeTrace("its steps are not all NVTX step ranges")
    if inv.steps.group_by("pid").agg(pl.col("device").n_unique().alias("n"))["n"].max() > 1:
        raise WholeTrace("a process runs steps on several devices")
    if any(_is_note(x, "shared_device") for x in inv.warnings):
        raise WholeTrace("processes share a GPU")
    ids = _owned(inv.steps, w)
    known = calibration_free(inv)
    known["top_gaps"] = longest_gaps(known["gaps"])
    known["gaps"] = known["gaps"].clear()
    frames = {f: _renumbered(getattr(inv, f), ids) for f in INV_STEP_FRAMES}
    # a run's kernel table repeats a few hundred names per step: as categories, 8 bytes a row
    # rather than two copies of a long demangled name
    frames["kernels"] = frames["kernels"].with_columns(pl.col("name", "demangled").cast(pl.Categorical))
    frames["collectives"] = _renumbered(inv.collectives, ids)
    frames["host_silences"] = inv.host_silences
    kn = {k: _renumbered(v, ids) if isinstance(v, pl.DataFrame) else v for k, v in known.items()}
    return WindowResult(w.index, ids.height, frames, kn, _own_of(trace, inv, w, own_ranges),
                        tuple(inv.class_by_parts), inv.startup if w.own_lo is None else None)


def _is_note(x, code: str) -> bool:
    return getattr(x, "code", None) == code


def _own_of(trace, inv, w: Window, own_ranges: dict) -> Own:
    """The window's Own. Each call is the window's that owns its start, each activity the window's
    that owns its launching call (the clock check's early and late kernels), or its own start (the
    kernel count; a launch-less activity): a window holds every activity that starts in its own
    span (launched by its calls, or loose: window_trace), so these partition the trace's."""
    from stepscope.analysis.capture_check import CLOCK_LATE_NS, CLOCK_SLACK_NS, _records_end

    gpu = set(trace.kernels["pid"].unique().to_list()) | set(trace.memops["pid"].unique().to_list())
    api_end = trace.api["end"].max() if trace.api.height else None
    ends = _records_end(trace, trace.api)
    keys = {"pid": pl.Int64, "corr": pl.Int64, "start": pl.Int64}
    if inv is None:  # no step in it: its kernels counted, nothing to match
        n = trace.kernels.filter(_in("start", w.own_lo, w.own_hi)).height
        return Own(own_ranges, {}, ends, api_end, gpu, n, pl.DataFrame(schema=keys), pl.DataFrame(schema=keys))
    a = inv.acts.lazy()
    own_start = _in("start", w.own_lo, w.own_hi)
    launched = pl.col("launch_start").is_not_null()
    own_launch = launched & _in("launch_start", w.own_lo, w.own_hi)
    early, late = pl.col("launch_start") - pl.col("start"), pl.col("start") - pl.col("launch_start")
    k = a.filter(pl.col("is_kernel") & own_launch)
    clock = k.select(n_early=(early > CLOCK_SLACK_NS).sum(), by_early=early.max(),
                     n_late=(late >= CLOCK_LATE_NS).sum(), by_late=late.max()).collect().row(0, named=True)
    n = a.filter(pl.col("is_kernel") & own_start).select(pl.len()).collect().item()
    key = [pl.col(c).cast(t) for c, t in keys.items()]
    loose = a.filter(~launched & own_start).select(key).collect()
    away = a.filter(own_launch & ~own_start).select(key).collect()
    return Own(own_ranges, clock, ends, api_end, gpu, n, loose, away)


def combined(trace, results):
    """(Inventory, its calibration-free frames) of the whole trace from its windows' results (in
    window order): each window's steps numbered after the windows before it, the per-step frames
    one after another, the warnings and defects the whole trace would have. What a kept analysis
    by windows keeps (by_windows.py)."""
    parts_inv: dict[str, list] = {}
    parts_known: dict[str, list] = {}
    owns: list[Own] = []
    class_by: list[list] = [[], [], [], []]
    startup = None
    offset = 0
    for r in results:
        owns.append(r.own)
        if r.startup is not None:
            startup = r.startup
        if not r.steps:
            continue
        for k, v in r.inv.items():
            if k == "kernels":  # categories of this process (a dask worker's came as text)
                v = v.with_columns(pl.col("name", "demangled").cast(pl.Categorical))
            parts_inv.setdefault(k, []).append(_shifted(v, offset))
        for k, v in r.known.items():
            parts_known.setdefault(k, []).append(_shifted(v, offset) if isinstance(v, pl.DataFrame) else v)
        for i, f in enumerate(r.class_by):
            class_by[i].append(f)
        offset += r.steps
    if not parts_inv:
        from stepscope.analysis.steps import NoStep

        raise NoStep(f"{trace.path}: no step found (no kernels with a launching call inside a step range); "
                     "check --step-regex or capture with an NVTX range per step")
    cat = {k: _concat(v) for k, v in parts_inv.items()}
    del parts_inv
    known = {k: (_concat(v) if isinstance(v[0], pl.DataFrame) else v[0]) for k, v in parts_known.items()}
    del parts_known
    return merged_inventory(trace, cat, owns, class_by, startup), known


def _shifted(f: pl.DataFrame, offset: int) -> pl.DataFrame:
    """A window's frame with its steps numbered after the `offset` steps of the windows before."""
    if not offset or "step" not in f.columns:
        return f
    return f.with_columns(pl.col("step") + offset)


def merged_inventory(trace, cat: dict, owns: list, class_by: list, startup):
    """The Inventory of the whole trace from its windows' own frames: the per-step frames one
    after another, the evidence, warnings and capture defects the whole trace would have."""
    from stepscope.analysis.inventory import Inventory, impossible_figures
    from stepscope.analysis.notes import EMPTY_STEP_RANGES, NO_LAUNCHING_CALL, PHASE_FROM_NAMES, note
    from stepscope.classes import ATTENTION as ATTENTION_CLASSES
    from stepscope.analysis.startup import STARTUP_SCHEMA

    steps = cat["steps"]
    gpu = set().union(*(o.gpu_pids for o in owns))
    ranges = sum(n for o in owns for pid, n in o.ranges.items() if pid in gpu)
    warnings = list(trace.warnings)
    if ranges - steps.height:
        warnings.append(note(EMPTY_STEP_RANGES, count=ranges - steps.height))
    attention = cat["classes"].filter(pl.col("class").is_in(list(ATTENTION_CLASSES))).group_by("step").agg(
        pl.col("count").sum().alias("n"))
    unresolved = steps.filter(pl.col("phase").is_null()).join(attention, on="step").filter(pl.col("n") > 0).height
    if unresolved:
        warnings.append(note(PHASE_FROM_NAMES, count=unresolved))
    warnings += impossible_figures(steps, cat["classes"])
    no_launch = _launch_less(owns)
    if no_launch:
        warnings.append(note(NO_LAUNCHING_CALL, count=no_launch))
    class_by = pl.concat([_concat(c) for c in class_by if c] or [pl.DataFrame(schema=_evidence_schema())],
                         how="vertical_relaxed").unique(["name", "demangled", "class"], keep="first", maintain_order=True)
    inv = Inventory(trace, steps, cat["classes"], cat["kernels"], pl.DataFrame(), pl.DataFrame(), pl.DataFrame(),
                    warnings, cat["collectives"], class_by, cat["framework"], cat["framework_ops"], cat["graph_steps"],
                    None, startup if startup is not None else pl.DataFrame(schema=STARTUP_SCHEMA),
                    _defects(trace, steps, owns), host_silences=cat["host_silences"])
    inv.kernels_total = sum(o.kernels for o in owns)
    return inv


def _evidence_schema():
    from stepscope.analysis.evidence import EVIDENCE_SCHEMA

    return EVIDENCE_SCHEMA


def _defects(trace, steps: pl.DataFrame, owns: list) -> pl.DataFrame:
    """The capture's defects the whole trace would have (capture_check), from the windows' ends
    and clock counts: the records' ends per process, the session, the clock."""
    from dataclasses import replace as _replace

    from stepscope.analysis import capture_check as cc
    from stepscope.analysis.inventory import _session_end
    from stepscope.analysis.steps import vllm_engine_pids

    ends = pl.concat([o.ends for o in owns]).group_by("pid").agg(pl.col("end").max()).sort("pid")
    api_ends = [o.api_end for o in owns if o.api_end is not None]
    gpu = sorted(set().union(*(o.gpu_pids for o in owns)))
    # a trace of one row per process: its last record's end, what _truncated and vllm_engine_pids read
    rows = pl.DataFrame({"pid": pl.Series(gpu, dtype=pl.Int32)}).join(
        ends.with_columns(pl.col("pid").cast(pl.Int32)), on="pid", how="left")
    summary = _replace(trace, kernels=rows, memops=rows.clear(), api=rows.clear())
    api = pl.DataFrame({"end": pl.Series([max(api_ends)] if api_ends else [], dtype=pl.Int64)})
    session_end = _session_end(trace, api)
    vllm = vllm_engine_pids(summary)
    recorded = cc.record_defects(summary, rows.clear(), session_end, vllm, set())
    clock = _clock(owns, session_end)
    if clock is not None:
        refused = cc.refusal(trace.path, clock)
        if refused:
            from stepscope.errors import InputError

            raise InputError(refused)
        recorded.append(clock)
    return cc.defect_frame(recorded + cc.step_defects(trace, steps, vllm))


def _launch_less(owns: list) -> int:
    """The activities no call of the trace launched: loose in the window that owns their start,
    launched in none (no window's calls launched them elsewhere)."""
    loose = pl.concat([o.loose for o in owns])
    if loose.is_empty():
        return 0
    return loose.join(pl.concat([o.away for o in owns]), on=["pid", "corr", "start"], how="anti").height


def _clock(owns: list, session_end):
    """capture_check.clock_defect over the trace's kernels, from the windows' counts."""
    from stepscope.analysis import capture_check as cc

    c = [o.clock for o in owns if o.clock]
    n = sum(o.kernels for o in owns)
    if not n:
        return None
    agg = {"n_early": sum(x["n_early"] or 0 for x in c), "n_late": sum(x["n_late"] or 0 for x in c),
           "by_early": max((x["by_early"] for x in c if x["by_early"] is not None), default=0),
           "by_late": max((x["by_late"] for x in c if x["by_late"] is not None), default=0)}
    return cc.clock_from_counts(n, agg, session_end)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The windows' frames one after another (a window's frame with no column at all, where
    that analysis found nothing to say, stands for no row)."""
    shaped = [f for f in frames if f.width] or frames[:1]
    return pl.concat(shaped, how="vertical_relaxed")
