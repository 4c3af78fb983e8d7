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
`execute_context…` ranges, `--step-regex`), vLLM's engine iterations cut along its scheduler
ranges (`schedule: …`), or, in a plain capture without any range, the iterations of vLLM's engine
loop: each step is then a range of host time that a window can hold whole. An iteration is one or
many scheduler ranges and runs to the next one's first: a window whose last own iteration has no
next one inside it is read further (analyze_read). The engine loop's steps are found once over the
whole run, from a light read of it (the kernels of the loop's input preparation and output, the
device-to-host copies, the API calls that decide the steps: engine_plan), and each window is given those that meet it: what
decides them (the most common preparation kernel, the start-up's warm-up runs, the output before
each preparation) is the run's, not a window's. Where the steps are none of these (capture ranges,
periods, several devices per process), `plan` or a window says why and the trace is analyzed whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from stepscope.analysis.steps import VLLM_SCHEDULE_PREFIX, _windows_nvtx
from stepscope.model import in_span as _in, window_events

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
    ranges: tuple = ()  # (pid, how many NVTX step ranges of that process start in the own span)
    kinds: tuple = ()   # (pid, the delimiter its steps are cut along: nvtx or schedule), the trace's
    # the ends its events are read to again, in turn, when its last own engine iteration runs
    # past its context (analyze_read); None: to the trace's end
    wider: tuple = ()
    # a run whose steps are its engine loop's: those steps (steps.engine_windows' rows) that meet
    # [lo, hi), found over the whole run (engine_plan); None for another run
    engine: tuple | None = None


SHARED_START = "two of its engine loop's steps begin at one time (rows recorded twice?)"
NO_RANGES = ("no NVTX step range, vLLM scheduler range or engine-loop iteration: the steps are found from the "
             "whole trace")


@dataclass(frozen=True)
class Plan:
    windows: tuple[Window, ...]
    why_whole: str | None = None  # why the trace is analyzed whole (windows is then empty)


def step_ranges(nvtx: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    """What windows are cut along (pid, tid, w_start, delimiter): the trace's NVTX step ranges,
    and, for a process without any, vLLM's scheduler ranges (`schedule: …`,
    VLLM_NVTX_SCOPES_FOR_PROFILING=1), at one of which each of its engine iterations starts
    (steps.py's `schedule` steps). A user's --step-regex cuts along its own ranges only."""
    cols = [pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col("w_start").cast(pl.Int64),
            pl.col("delimiter").cast(pl.String), pl.col("name").cast(pl.String)]
    w = _windows_nvtx(nvtx, step_regex).select(cols)
    if step_regex or nvtx.is_empty():
        return w
    sched = nvtx.filter(pl.col("name").str.starts_with(VLLM_SCHEDULE_PREFIX)
                        & ~pl.col("pid").cast(pl.Int64).is_in(w["pid"].unique().implode()))
    sched = sched.select(pl.col("start").alias("w_start"), "pid", "tid", pl.lit("schedule").alias("delimiter"), "name")
    return pl.concat([w, sched.select(cols)]) if sched.height else w


def engine_plan(light, launched) -> pl.DataFrame:
    """The engine loop's steps of a whole run (steps.engine_windows: a plain capture without any
    range) from its light read (`light`: the kernels of vLLM's input preparation and output, the
    device-to-host copies, and the API calls that decide the steps: ingest/nsys_windows.read_marks,
    analysis/engine_calls.py), `launched(lo, hi)` reading the kernels of a start-up's warm-up run.
    The last step of each process is open: the window that owns it reads to the trace's end and
    closes it, as the whole trace does."""
    from stepscope.analysis.engine_calls import mark_pids
    from stepscope.analysis.steps import engine_windows, trace_api_flags

    return engine_windows(light, trace_api_flags(light), mark_pids(light), launched)


def engine_ranges(engine: pl.DataFrame) -> pl.DataFrame:
    """step_ranges' frame of a run's engine steps (engine_plan): each step's start a range's."""
    return engine.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col("w_start").cast(pl.Int64),
                         pl.col("delimiter").cast(pl.String), pl.col("name").cast(pl.String))


# the kinds of range a window counts as a step each (an engine iteration is many `schedule` ranges)
ONE_RANGE_A_STEP = ("nvtx", "engine")


def plan(nvtx: pl.DataFrame, step_regex: str | None, window_steps: int = WINDOW_STEPS,
         ranges: pl.DataFrame | None = None, engine: pl.DataFrame | None = None) -> Plan:
    """The windows of a trace whose NVTX table is `nvtx`: every `window_steps` ranges of
    step_ranges (in start order over every thread) a window boundary, at a range's start.
    `ranges`: step_ranges(nvtx, step_regex), when the caller has them; `engine`: the run's engine
    steps (engine_plan; `ranges` are then engine_ranges'), each window given those it meets.

    A window's events reach, for each process with ranges in its own span, one of its ranges
    before them and two after: the context that the first own step's begin (the previous step's
    GPU work) and the last one's end (a vLLM step or engine iteration runs to the next
    iteration's range) are read from. A process whose ranges run out within that context reads
    to the trace's end (its last step runs to its last recorded work)."""
    w = step_ranges(nvtx, step_regex) if ranges is None else ranges
    if w.is_empty():
        return Plan((), NO_RANGES)
    starts = w["w_start"].sort()
    n = starts.len()
    if n <= window_steps:
        return Plan((), "one window holds every step")
    kinds = tuple(w.select("pid", "delimiter").unique().sort("pid").iter_rows())
    if len({pid for pid, _ in kinds}) < len(kinds):
        return Plan((), "a process's steps are cut along two kinds of range")
    by_pid = {pid: g["w_start"].sort() for (pid,), g in w.group_by("pid")}
    # the ranges of one engine iteration, about: one schedule() call holds each of its range names
    # once or more (`allocate_slots` once per request), so its rarest name counts the calls
    named = w.group_by("pid", "name").len().group_by("pid").agg(n=pl.col("len").sum(), calls=pl.col("len").min())
    per = {pid: 1 if dict(kinds)[pid] in ONE_RANGE_A_STEP else -(-n // calls) for pid, n, calls in named.iter_rows()}
    # at a range's start, each once and past the first range (ranges of one start, a capture's rows
    # twice, go to one window: a cut between them would leave a window that owns no range)
    cuts = sorted({int(starts[i]) for i in range(window_steps, n, window_steps)})
    cuts = [c for c in cuts if c > int(starts[0])]
    # an engine iteration's first step is the start-up's end, or a capture range's (steps.py):
    # a window holds a process's first iteration only with the trace's beginning
    late = [pid for pid, d in kinds if d == "schedule" and cuts and int(by_pid[pid][0]) >= cuts[0]]
    if late:
        return Plan((), "a process's engine iterations begin after the first window")
    bounds = [None, *cuts, None]
    out = []
    for i in range(len(bounds) - 1):
        own_lo, own_hi = bounds[i], bounds[i + 1]
        los, his, mine = [], [], []
        for pid, s in sorted(by_pid.items()):
            a = 0 if own_lo is None else s.search_sorted(own_lo, "left")
            b = s.len() if own_hi is None else s.search_sorted(own_hi, "left")
            if b <= a:
                continue
            mine.append((pid, b - a))
            los.append(None if own_lo is None else int(s[a - 1]) if a else own_lo)
            # two ranges (iterations) after the own ones, then (analyze_read) 4, 8, 16, … and the end
            his.append([None if own_hi is None or b + k * per[pid] >= s.len() else int(s[b + k * per[pid]])
                        for k in _CONTEXT_AFTER])
        if own_lo is not None:  # and the range before its own ones of any process's
            los.append(int(starts[starts.search_sorted(own_lo, "left") - 1]))
        lo = None if None in los else min(los)
        ends = [None if None in level else max(level) for level in zip(*his)]
        ends = ends[:ends.index(None) + 1] if None in ends else ends + [None]
        own_nvtx = tuple((pid, k) for pid, k in mine if dict(kinds)[pid] in ONE_RANGE_A_STEP)
        met = None
        if engine is not None:  # the steps whose host time meets [lo, ends[0])
            met = tuple(engine.filter(((pl.col("w_end") >= lo) if lo is not None else pl.lit(True))
                                      & ((pl.col("w_start") < ends[0]) if ends[0] is not None else pl.lit(True))).rows())
        out.append(Window(i, own_lo, own_hi, lo, ends[0], own_nvtx, kinds, tuple(ends[1:]), met))
    return Plan(tuple(out))


# how many of a process's ranges (of its engine iterations: each about that many ranges) after its
# own ones a window's events reach, and, when its last own engine iteration runs past them, reach
# next
_CONTEXT_AFTER = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class RunsPast(Exception):
    """A window's last own engine iteration runs past its context (analyze_read reads further)."""


def analyze_read(read, w: Window, step_regex, rules, sub=None) -> "WindowResult":
    """Window `w` read by `read(window, count)` (`sub`: its trace, already read) and analyzed;
    when its last own engine iteration runs past its context, read to its next end (w.wider) and
    analyzed again. Only the first read counts what the reading leaves out (the own rows are the
    same in each)."""
    wider = iter(w.wider)
    while True:
        sub = read(w, True) if sub is None else sub
        try:
            return analyze_window(sub, w, step_regex, rules)
        except RunsPast:
            w = replace(w, hi=next(wider))
            sub = read(w, False)


def window_trace(trace, w: Window):
    """The trace of window `w`: the API calls that started in it, the kernels and memops they
    launched (or that started in it, launched by no call of the window), the NVTX ranges that
    overlap it; the rest of the trace (names, GPUs, threads) as it is."""
    api = trace.api.filter(_in("start", w.lo, w.hi))
    return replace(trace, **window_events(api, trace.kernels, trace.memops, trace.nvtx, w.lo, w.hi),
                   warnings=[], cache_entry=None, cache_dir=None, reread=None)


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
    # its own engine iterations (step, pid, tid, pos: their place among the thread's own ones) and
    # how many it owns per thread ((pid, tid, n), …): combined() numbers them in the trace
    iterations: pl.DataFrame | None = None
    iteration_counts: tuple = ()


def analyze_window(trace, w: Window, step_regex, rules, launch_config=None) -> WindowResult:
    """Window `w`'s own steps analyzed (the trace `trace` is window_trace's for `w`). RunsPast:
    its last own engine iteration runs past its context (analyze_read reads it further)."""
    from stepscope.analysis.diagnosis import calibration_free, longest_gaps
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.analysis.steps import NoStep
    from stepscope.errors import InputError

    own_ranges = dict(w.ranges)
    if w.engine is not None:
        from stepscope.analysis.steps import WINDOW_SCHEMA

        trace = replace(trace, engine_windows=pl.DataFrame(list(w.engine), schema=WINDOW_SCHEMA, orient="row"))
    iterations = _own_iterations(trace, w)
    if iterations is not None and not iterations.height and not w.ranges:
        # no step of its own (its ranges are the middle of an iteration that began before it)
        return WindowResult(w.index, 0, {}, {}, _own_of(trace, None, w, own_ranges), (), None)
    try:
        inv = analyze_trace(trace, step_regex, rules, launch_config=launch_config or trace.launch_config,
                            refuse=False)
    except InputError as e:  # NoStep among them
        # its ranges launched nothing (a window of one empty step range), or (a vLLM engine whose
        # window holds no iteration that did) "no engine step"
        if not isinstance(e, NoStep) and iterations is None:
            raise
        if iterations is not None and iterations.height:  # how many launched work went uncounted
            raise WholeTrace("a window's engine iterations hold no step") from None
        return WindowResult(w.index, 0, {}, {}, _own_of(trace, None, w, own_ranges), (), None)
    kinds = dict(w.kinds)
    found = inv.steps.select(pl.col("pid").cast(pl.Int64), "delimiter").unique()
    if any(kinds.get(pid) != d for pid, d in found.iter_rows()):
        raise WholeTrace("a process's steps in a window are not the ranges the windows were cut along")
    if inv.steps.group_by("pid").agg(pl.col("device").n_unique().alias("n"))["n"].max() > 1:
        raise WholeTrace("a process runs steps on several devices")
    if any(_is_note(x, "shared_device") for x in inv.warnings):
        raise WholeTrace("processes share a GPU")
    ids = _owned(inv.steps, w)
    numbered = None
    if iterations is not None:
        # an engine iteration is no NVTX range of the plan's count: the iterations the window
        # found in its own span are (those that launched nothing included: EMPTY_STEP_RANGES)
        sched = inv.windows_found.filter((pl.col("delimiter") == "schedule") & _in("w_start", w.own_lo, w.own_hi))
        own_ranges |= dict(sched.group_by(pl.col("pid").cast(pl.Int64)).len().iter_rows())
        # each own iteration's place among its thread's own iterations: combined() names it
        # `schedule #n` by its place in the trace
        numbered = _renumbered(inv.steps.filter(pl.col("delimiter") == "schedule").select(
            "step", pl.col("pid").cast(pl.Int64), pl.col("w_start").alias("start")).join(
            iterations, on=["pid", "start"], how="inner"), ids).select("step", "pid", "tid", "pos")
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
    counts = () if iterations is None else tuple(iterations.group_by("pid", "tid").len().sort("pid", "tid").iter_rows())
    return WindowResult(w.index, ids.height, frames, kn, _own_of(trace, inv, w, own_ranges),
                        tuple(inv.class_by_parts), inv.startup if w.own_lo is None else None, numbered, counts)


def _own_iterations(trace, w: Window) -> pl.DataFrame | None:
    """(pid, tid, start, pos) of the engine iterations that start in the window's own span (pos:
    their place among the thread's own ones), for a window cut along `schedule: …` ranges (None
    for another). RunsPast when one of those threads has no iteration after its own ones in the
    window: the last own one would run to the window's end, not to the next iteration's start,
    and might launch its work past it."""
    from stepscope.analysis.steps import iteration_starts, trace_api_flags

    if not any(d == "schedule" for _, d in w.kinds):
        return None
    # the flags of the own ranges are the trace's: the range before them lies in the window
    it = iteration_starts(trace.nvtx, trace_api_flags(trace))
    own = it.filter(_in("start", w.own_lo, w.own_hi))
    if w.hi is not None and own.height:
        after = it.filter(pl.col("start") >= w.own_hi).select("pid", "tid").unique()
        if own.select("pid", "tid").unique().join(after, on=["pid", "tid"], how="anti").height:
            raise RunsPast()
    return own.sort("pid", "tid", "start").with_columns(pos=pl.int_range(pl.len()).over("pid", "tid")).drop("i")


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
    if inv is None:  # no step in it: its activities beside their launching calls, as analyze_trace's
        calls = trace.api.lazy().select("pid", "corr", pl.col("start").alias("launch_start")).unique(
            ["pid", "corr"], keep="first")
        a = pl.concat([trace.kernels.lazy().select("pid", "corr", "start", is_kernel=pl.lit(True)),
                       trace.memops.lazy().select("pid", "corr", "start", is_kernel=pl.lit(False))]).join(
            calls, on=["pid", "corr"], how="left")
    else:
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
    before: dict = {}  # (pid, tid) -> the engine iterations of the windows before
    names = []
    for r in results:
        owns.append(r.own)
        if r.startup is not None:
            startup = r.startup
        if r.iterations is not None and r.iterations.height:
            prior = pl.DataFrame([(p, t, n) for (p, t), n in before.items()], orient="row",
                                 schema={"pid": pl.Int64, "tid": pl.Int64, "_before": pl.Int64})
            names.append(r.iterations.join(prior, on=["pid", "tid"], how="left", maintain_order="left")
                         .with_columns(pl.col("step") + offset, pl.col("_before").fill_null(0)))
        for pid, tid, n in r.iteration_counts:
            before[(pid, tid)] = before.get((pid, tid), 0) + n
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
    if not parts_inv:  # the whole trace's analysis says why, in its words
        raise WholeTrace("no window holds a step")
    cat = {k: _concat(v) for k, v in parts_inv.items()}
    del parts_inv
    if names:  # an engine iteration is `schedule #n` by its place on its thread in the trace
        n = pl.concat(names).select(pl.col("step").cast(cat["steps"].schema["step"]), pl.format(
            "schedule #{}", pl.col("_before") + pl.col("pos") + 1).alias("_name"))
        cat["steps"] = cat["steps"].join(n, on="step", how="left", maintain_order="left").with_columns(
            pl.coalesce("_name", "name").alias("name")).drop("_name")
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
    parts = pl.concat([_concat(c) for c in class_by if c] or [pl.DataFrame(schema=_evidence_schema())],
                      how="vertical_relaxed")
    class_by = parts.unique(["name", "demangled", "class"], keep="first", maintain_order=True)
    kernels = cat["kernels"]
    # a name's evidence is the trace's first reason, where windows gave it different ones (each
    # window's kernels carry its own first; the join copies the run's kernel table: only then)
    if parts.unique(["name", "demangled", "class", "class_by"]).height > class_by.height:
        kernels = kernels.drop("class_by").join(
            class_by.with_columns(*(pl.col(c).cast(kernels.schema[c]) for c in ("name", "demangled", "class"))),
            on=["name", "demangled", "class"], how="left", maintain_order="left")
    inv = Inventory(trace, steps, cat["classes"], kernels, pl.DataFrame(), pl.DataFrame(), pl.DataFrame(),
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
