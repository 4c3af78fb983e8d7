"""Per-step inventory: kernel classes, busy/span/idle, launch calls, layers.

Every figure is computed exactly as docs/DEFINITIONS.md defines it, as vectorized
polars expressions over the whole trace at once (no Python loop over kernels or steps).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import polars as pl

from stepscope.analysis.classify import ATTENTION, CLASS_DTYPE, RuleSet, classify_names, load_rules, nvtx_attribution
from stepscope.analysis.evidence import EVIDENCE_SCHEMA, fused_notes, place_anonymous, place_router
from stepscope.analysis.framework import FAMILY_SCHEMA, OP_SCHEMA, framework_tables
from stepscope.analysis.frames import group_by_packed, join_key, lookup, packing, sorted_by
from stepscope.analysis.layers import layer_keys, layer_pattern
from stepscope.analysis.lazy_numpy import np
from stepscope.analysis.memory import KEEP, Retention
from stepscope.analysis.notes import (
    BAD_COVERAGE, BAD_TIMES, NO_LAUNCHING_CALL, PHASE_FROM_NAMES, STEP_REGEX_UNMATCHED, note,
)
from stepscope.analysis.overlap import shared_devices
from stepscope.analysis.pauses import empty_silences, host_silences
from stepscope.analysis.phase import PHASE_SCHEMA, phase_evidence
from stepscope.analysis.composition import with_composition
from stepscope.analysis.startup import STARTUP_SCHEMA, startup
from stepscope.analysis.steps import (NoStep, activities, engine_pids_without_steps, find_windows,
                                      segment, split_capture_windows, step_shape, trace_api_flags, vllm_engine_pids,
                                      window_of)
from stepscope.analysis import capture_check
from stepscope.errors import InputError
from stepscope.classes import ATTENTION_OF_PHASE
from stepscope.launch_config import DIMS, LaunchConfigReader
from stepscope.model import Trace


@dataclass
class Inventory:
    """The analysis of one trace: one row per step plus long per-class and per-kernel tables."""

    trace: Trace
    steps: pl.DataFrame      # one row per step, the figures of DEFINITIONS.md
    classes: pl.DataFrame    # step, class, count, time_ns
    kernels: pl.DataFrame    # step, name, demangled, class, count, time_ns, class_by (what classed
                             # a kernel when its name did not: null where the name did)
    acts: pl.DataFrame       # every activity with step, class and launch columns, sorted by
                             # (step, start); prev_end: the end of the union before it
                             # (narrowed by the memory policy: ONE_SHOT_ACT_COLUMNS, EXPORT_ACT_COLUMNS)
    api: pl.DataFrame        # API calls with flags (only the synchronizing ones, which the gap
                             # attribution reads, where the memory policy says: analysis/memory.py)
    launch_calls: pl.DataFrame  # the launch calls of each step: step, pid, tid, corr, start, end, api_name
    warnings: list[str] = field(default_factory=list)
    # the collective (class comm) kernels of the whole trace, in or outside a step: step, pid,
    # device, stream, name, start, end. Kept apart because the one-shot analysis drops the
    # activities' stream column, which matching a collective across ranks needs
    collectives: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=COLLECTIVE_SCHEMA))
    # kernels classed by evidence other than their name (NVTX ranges, their place in the layer):
    # name, demangled, class, class_by
    class_by: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=EVIDENCE_SCHEMA))

    # the framework class broken down per step: by op family (step, family, count, time_ns) and,
    # where NVTX ranges name ops (emit_nvtx), by the op that launched it (step, op, family, count, time_ns)
    framework: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FAMILY_SCHEMA))
    framework_ops: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=OP_SCHEMA))
    # the steps that replay a CUDA graph (a kernel of theirs is a graph node): step. Taken before
    # any activity frame may go, for the what-if and compare that read it after
    graph_steps: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"step": pl.Int64}))
    # reads grid/block of chosen kernels from the export (stepscope.launch_config) when the
    # trace was read without them; see step_acts()
    launch_config: LaunchConfigReader | None = None
    # what a serving process ran before its first engine step (analysis/startup.py): one row per process
    startup: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=STARTUP_SCHEMA))
    # the capture's own defects (analysis/capture_check.py): one row per defect, shown before any step
    capture: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=capture_check.DEFECT_SCHEMA))
    # the launching threads' silences of PAUSE_MIN_NS and longer (analysis/pauses.py): taken while
    # every API call is at hand, for the host pauses the diagnosis finds among them
    host_silences: pl.DataFrame = field(default_factory=empty_silences)
    # the key under which this one-shot analysis is kept beside its export's cached frames
    # (library.load), None when it is not: its diagnosis is kept under the same key
    kept: str | None = field(default=None, repr=False, compare=False)

    def frames(self) -> dict[str, pl.DataFrame]:
        """The inventory's frames by field name (FRAME_FIELDS): what restored() takes back."""
        return {f: getattr(self, f) for f in FRAME_FIELDS}

    @classmethod
    def restored(cls, trace: Trace, frames: dict, warnings: list[str],
                 launch_config: LaunchConfigReader | None = None, *, events: bool = True) -> "Inventory":
        """The inventory whose frames() were `frames` and whose own warnings (beyond the
        trace's) were `warnings`, over `trace` as read again. Activities come back sorted by
        (step, start) with the step-less last, as analyze_trace leaves them. The activities and
        launch calls may be given as functions that read them, with `acts_empty` and
        `launch_calls_empty` (their columns, no row): `events` says, up front, whether they are
        read now; without, the inventory holds none (a one-shot document reads only the per-step
        results: library.load(..., events=False)) and an access says so."""
        late = {f: frames[f] for f in LATE_FIELDS if callable(frames.get(f))}
        need = set(FRAME_FIELDS) | {f"{f}_empty" for f in late}
        if not need <= set(frames) <= set(FRAME_FIELDS) | {f"{f}_empty" for f in LATE_FIELDS}:
            raise ValueError(f"an inventory has the frames {FRAME_FIELDS}, not {tuple(frames)}")
        given = {f: (late[f]() if f in late and events else pl.DataFrame() if f in late else frames[f])
                 for f in FRAME_FIELDS}
        inv = cls(trace=trace, warnings=list(trace.warnings) + list(warnings), launch_config=launch_config, **given)
        if late and not events:
            for f in late:
                del inv.__dict__[f]
            inv.__dict__["_unread"] = (late, {f: frames[f"{f}_empty"] for f in late})
        return inv

    def read_events(self) -> "Inventory":
        """Read the activities and launch calls restored() was told not to read (events=False),
        when a caller finds it needs them after all (library._diagnosed: the diagnosis kept
        beside the analysis is not there). Returns the inventory."""
        unread = self.__dict__.pop("_unread", None)
        if unread is not None:
            for f, read in unread[0].items():
                self.__dict__[f] = read()
        return self

    def __getattr__(self, name: str):
        # reached only when normal lookup fails: a frame restored() was told not to read
        if name in LATE_FIELDS and self.__dict__.get("_unread") is not None:
            raise AttributeError(f"the inventory's {name} frame was not read from the kept analysis "
                                 "(restored with events=False: only the per-step results are read; "
                                 "Inventory.read_events() reads them)")
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def step_acts(self, step: int) -> pl.DataFrame:
        """One step's activities, with every kernel's grid and block (with_launch_config)."""
        return self.with_launch_config(self.acts.filter(pl.col("step") == step))

    def with_launch_config(self, a: pl.DataFrame, rows: pl.DataFrame | None = None) -> pl.DataFrame:
        """Activities `a` (rows of self.acts) with every kernel's grid and block: when the trace
        was read without them, read for these kernels alone from the export, or taken from
        `rows` (launch_config_rows() of a frame `a` is part of). Null where neither the trace
        nor a reader has them, and for memops."""
        if all(c in a.columns for c in DIMS):
            return a
        given = rows is not None
        rows = rows if given else self.launch_config_rows(a)
        if rows is None or a.height == 0:
            return a.with_columns([pl.lit(None, pl.Int64).alias(c) for c in DIMS])
        dims = _joined_dims(a, rows)
        if not given and dims.select((pl.col("is_kernel") & pl.col("_hit").is_null()).any()).item():
            # the narrowed read missed a kernel (the export's rows are not in start order there)
            dims = _joined_dims(a, self.launch_config_rows(a, narrow=False))
        return a.hstack(dims.select([pl.when(pl.col("is_kernel")).then(pl.col(c)).alias(c) for c in DIMS]))

    def launch_config_rows(self, a: pl.DataFrame, narrow: bool = True) -> pl.DataFrame | None:
        """pid, corr, start and grid/block of the kernels of the export that started on the
        devices and in the time span of the kernels of `a`, sorted by start; None without a
        reader (stepscope.launch_config). `narrow`: read where the export's row order says they
        are (NsysLaunchConfig.window; with_launch_config checks none was missed)."""
        window = getattr(self.launch_config, "window", None)
        k = a.lazy().filter(pl.col("is_kernel")).select(
            pl.col("device").unique().sort().implode(), lo=pl.col("start").min(), hi=pl.col("start").max()).collect()
        if window is None or k["lo"][0] is None:
            return None
        devices = [d for d in k["device"][0].to_list() if d is not None]
        rows = window(devices, k["lo"][0], k["hi"][0], narrow).select(
            *[pl.col(c).cast(a.schema[c]) for c in ("pid", "corr", "start")], *DIMS)
        return rows if rows["start"].is_sorted() else rows.sort("start", maintain_order=True)

    def in_steps(self, *cols: str) -> pl.DataFrame:
        """The activities inside a step, narrowed to `cols` (see in_steps())."""
        return in_steps(self.acts, *cols)

    def drop_event_frames(self) -> None:
        """Empty the per-event frames (activities, API calls, launch calls, the trace's tables),
        keeping the per-step results: for a one-shot renderer that has what it needs and
        would otherwise hold a million-row frame per column through its output."""
        unread = self.__dict__.pop("_unread", None)
        if unread is not None:  # never read: their columns stand for them
            self.__dict__.update(unread[1])
        self.acts, self.api, self.launch_calls = self.acts.clear(), self.api.clear(), self.launch_calls.clear()
        self.trace.drop_event_frames()

    def shown_warnings(self) -> list:
        """The warnings a report shows beside the capture's defects: those a defect stands
        for are left out (capture_check.beside_defects)."""
        return capture_check.beside_defects(self.capture, self.warnings)

    def kernel_total(self) -> int:
        """The trace's kernels, in a step or not: counted on the activities, or given by an
        analysis by windows (analysis/windows.py), whose inventory holds none."""
        given = self.__dict__.get("kernels_total")
        return int(self.acts["is_kernel"].sum()) if given is None else given

    def step_ids(self) -> list[int]:
        return self.steps["step"].to_list()

    def self_check(self) -> None:
        """busy + idle == span and Σ class time (kernels) == kernel time, for every step."""
        s = self.steps
        assert (s["gpu_busy_ns"] + s["idle_ns"] == s["gpu_span_ns"]).all()
        kt = (
            self.classes.filter(pl.col("class") != "memops")
            .group_by("step").agg(pl.col("time_ns").sum().alias("t"), pl.col("count").sum().alias("n"))
        )
        chk = s.select("step", "kernel_time_sum_ns", "n_kernels").join(kt, on="step", how="left").fill_null(0)
        assert (chk["t"] == chk["kernel_time_sum_ns"]).all()
        assert (chk["n"] == chk["n_kernels"]).all()


FRAME_FIELDS = ("steps", "classes", "kernels", "acts", "api", "launch_calls", "collectives", "class_by",
                "framework", "framework_ops", "graph_steps", "startup", "capture", "host_silences")
LATE_FIELDS = ("acts", "launch_calls")  # what Inventory.restored reads only when told to (events=True)


def _joined_dims(a: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """is_kernel, grid/block and _hit (null: no row of `rows` is that activity) per row of `a`,
    from the rows (sorted by start) in a's time span. A kernel is its launch (pid, correlation
    id) and its start: a CUDA graph's kernels share their launch's id. Only the key columns are
    joined, for a result put beside a's own: a join of the whole frame would copy each column."""
    keys = ["pid", "corr", "start"]
    lo, hi = a["start"].min(), a["start"].max()
    first = rows["start"].search_sorted(lo, side="left")
    rows = rows.slice(first, rows["start"].search_sorted(hi, side="right") - first).with_columns(_hit=pl.lit(True))
    dims = a.select(*keys, "is_kernel").join(rows, on=keys, how="left", maintain_order="left")
    if dims.height != a.height:  # two kernels of one launch that started at the same ns
        dims = a.select(*keys, "is_kernel").join(rows.unique(keys, keep="first", maintain_order=True), on=keys,
                                                 how="left", maintain_order="left")
    return dims


def in_steps(acts: pl.DataFrame, *cols: str) -> pl.DataFrame:
    """The activities inside a step, narrowed to `cols`: a zero-copy slice (acts are sorted by
    step with the step-less ones last), flagged sorted by step so per-step group-bys are cheap."""
    inside = acts.select(*cols).slice(0, acts.height - acts["step"].null_count())
    return inside.with_columns(pl.col("step").set_sorted()) if "step" in cols else inside


COLLECTIVE_SCHEMA = {"step": pl.Int64, "pid": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                     "name": pl.String, "start": pl.Int64, "end": pl.Int64}


def collective_kernels(acts: pl.DataFrame) -> pl.DataFrame:
    """The collective kernels (class comm) of an activity frame, COLLECTIVE_SCHEMA (a few
    hundred rows per step at most: the filter comes first)."""
    return acts.lazy().filter(pl.col("is_kernel") & (pl.col("class") == "comm")).select(
        [pl.col(c).cast(t) for c, t in COLLECTIVE_SCHEMA.items()]).collect()


def analyze_trace(trace: Trace, step_regex: str | None = None, rules: RuleSet | None = None,
                  memory: Retention = KEEP, launch_config: LaunchConfigReader | None = None,
                  strict: bool = False, refuse: bool = True) -> Inventory:
    """The per-step inventory of a trace. `memory`: what it may let go of on the way
    (analysis/memory.py; ONE_SHOT for a one-shot caller such as `analyze`). `launch_config` reads
    the grid/block of chosen kernel names when the trace was read without them
    (stepscope.launch_config): phase evidence needs a few. `strict` (--strict): a `step_regex`
    that matches no range with GPU work is an InputError, not a warning."""
    rules = rules or load_rules()
    api = trace_api_flags(trace)
    vllm = vllm_engine_pids(trace)
    windows = find_windows(trace, api, step_regex, vllm)
    without_steps = engine_pids_without_steps(vllm, windows)
    # what the capture lacks, read from the event frames before they may go (memory policy)
    session_end = _session_end(trace, api)
    recorded = capture_check.record_defects(trace, api, session_end, vllm, without_steps)
    api = api.with_columns(window_of(api, windows))
    acts = activities(trace.kernels, trace.memops, api)
    clock = capture_check.clock_defect(acts, session_end)  # each kernel beside its launch, joined once
    if clock is not None:
        # `refuse=False`: a window of a long run (analysis/windows.py) is no capture: whether the
        # capture's clocks refuse it is decided over all of its windows' kernels
        refused = capture_check.refusal(trace.path, clock) if refuse else None
        if refused:
            raise InputError(refused)
        recorded.append(clock)
    split = split_capture_windows(windows, acts, api)
    if split is not None:
        # a capture range that ran several whole steps: every call and activity takes the
        # window of the step it belongs to
        windows = split
        api = api.with_columns(window_of(api, windows))
        acts = acts.with_columns(window_of(acts.select(
            pl.col("pid"), pl.col("tid").fill_null(-1), pl.col("launch_start").fill_null(-1).alias("start")), windows))
    memory.activities_built(trace)
    try:
        seg = segment(trace, acts, windows, api.select("pid", "start", "is_sync").filter(pl.col("is_sync")),
                      without_steps)
    except NoStep:
        if not without_steps:
            raise
        # a vLLM engine whose trace holds no engine step: say what it holds and why, not "no step"
        raise InputError(capture_check.no_step_line(trace.path, capture_check.defect_frame(recorded))) from None
    defects = capture_check.defect_frame(recorded + capture_check.step_defects(trace, seg.steps, vllm))
    # the segmentation hands its frame over: when the sort below has to copy it (a TP trace's
    # steps interleave across devices), the unsorted frame must not stay alive beside the copy
    acts, seg.acts = seg.acts, None
    acts, phases, names, by_nvtx = _classify(acts, seg.steps, trace, rules, launch_config)
    started = startup(seg.steps, acts, api)
    # one sort for every interval figure: the running max of ends before each activity
    acts = sorted_by(acts, "step", "start", "end", consume=True).with_columns(
        prev_end=pl.col("end").cum_max().shift(1).over("step"))
    # only Inductor's names can have a shorter key: the others never reach Python
    triton = names.filter(pl.col("demangled").str.starts_with("triton_"))
    keys = layer_keys(dict(zip(triton["demangled_id"].to_list(), triton["demangled"].to_list())))
    layers = _layers(in_steps(acts, "step", "demangled_id", "is_kernel"), keys)
    # the router's top-k told from the sampler's by its place, before the anonymous kernels vote
    acts, routed = place_router(acts, names, rules)
    acts, evidence = place_anonymous(acts, names, rules, layers)
    families, ops = framework_tables(acts, names, trace.nvtx, rules)
    calls = step_launch_calls(seg.steps, acts, api, seg.window_steps)
    collectives = collective_kernels(acts)
    graph_nodes = acts.lazy().filter(pl.col("graph_node_id").is_not_null() & pl.col("step").is_not_null()).group_by(
        "step").agg(n_graph_nodes=pl.len().cast(pl.Int64)).sort("step").collect()
    silences = host_silences(api)
    acts, api = memory.launch_calls_found(acts, api)
    steps = _step_figures(seg.steps.join(phases, on="step", how="left"), acts, calls, layers)
    steps = with_composition(steps, graph_nodes, calls)
    classes, kernels = _class_tables(in_steps(acts, "step", "class", "name", "demangled", "start", "end"))
    # the steps that replay a CUDA graph: its nodes are rows (node level), or each graph launch is
    # one row of class cuda_graph (graph level: the kernels inside it are not in the trace)
    whole = classes.filter(pl.col("class") == "cuda_graph").select(pl.col("step").cast(pl.Int64))
    graph_steps = pl.concat([graph_nodes.select("step"), whole]).unique().sort("step")
    class_by_parts = (by_nvtx, routed, evidence, fused_notes(names, rules))
    class_by = pl.concat(class_by_parts).unique(
        ["name", "demangled", "class"], keep="first", maintain_order=True)
    kernels = _with_evidence(kernels, class_by)
    warnings = list(trace.warnings) + seg.warnings
    if step_regex and not (seg.steps["delimiter"] == "nvtx").any():
        if strict:
            raise InputError(f"--step-regex {step_regex!r} matched no NVTX range with GPU work (--strict): check "
                             "the pattern against the trace's range names, or leave --strict out")
        warnings.append(note(STEP_REGEX_UNMATCHED, regex=step_regex,
                             used=tuple(seg.steps["delimiter"].unique(maintain_order=True).to_list())))
    unresolved = steps.filter(pl.col("phase").is_null() & (pl.col("n_attention") > 0)).height
    if unresolved:
        warnings.append(note(PHASE_FROM_NAMES, count=unresolved))
    warnings += impossible_figures(steps, classes)
    warnings += shared_devices(acts)
    no_launch = acts.filter(pl.col("launch_start").is_null()).height
    if no_launch:
        warnings.append(note(NO_LAUNCHING_CALL, count=no_launch))
    inv = Inventory(trace, steps.drop("n_attention"), classes, kernels, acts, api, calls, warnings, collectives,
                    class_by, families, ops, graph_steps, launch_config, started, defects, host_silences=silences)
    inv.class_by_parts = class_by_parts  # by kind of evidence, for an analysis by windows (analysis/windows.py)
    inv.windows_found = windows  # the steps' host windows, empty ones included (analysis/windows.py counts them)
    memory.inventory_built(inv)
    return inv


def _session_end(trace: Trace, api: pl.DataFrame) -> int | None:
    """Where the trace's session ends on its events' clock (ingest/session.py); None when the
    export does not say (not an nsys SQLite export, no ANALYSIS_DETAILS)."""
    if not str(trace.format).startswith("nsys"):
        return None
    from stepscope.ingest.session import session_span

    last = api["end"].max() if api.height else None
    span = session_span(trace.path, last)
    return None if span is None else span.end_ns


def impossible_figures(steps: pl.DataFrame, classes: pl.DataFrame) -> list:
    """Warnings for steps whose figures cannot be right: a classified share of GPU time
    (coverage) outside 0-100 %, GPU busy above the span, a negative time. The readers leave
    out the values that make them (sanity.py); this says so if one still gets through."""
    per = classes.group_by("step").agg(
        total=pl.col("time_ns").sum(), other=pl.col("time_ns").filter(pl.col("class") == "other").sum())
    cov = per.filter(pl.col("total") != 0).with_columns(coverage=100 * (1 - pl.col("other") / pl.col("total")))
    out = []
    bad = cov.filter((pl.col("coverage") < 0) | (pl.col("coverage") > 100))
    if bad.height:
        out.append(note(BAD_COVERAGE, count=bad.height, low=float(bad["coverage"].min()),
                        high=float(bad["coverage"].max()), steps=tuple(bad["step"].head(5).to_list())))
    checks = {"busy_over_span": pl.col("gpu_busy_ns") > pl.col("gpu_span_ns"),
              "negative": pl.min_horizontal("step_time_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
                                            "kernel_time_sum_ns") < 0}
    for what, expr in checks.items():
        hit = steps.filter(expr.fill_null(False))
        if hit.height:
            out.append(note(BAD_TIMES, count=hit.height, what=what, steps=tuple(hit["step"].head(5).to_list())))
    return out


def _classify(acts: pl.DataFrame, steps: pl.DataFrame, trace: Trace, rules: RuleSet,
              launch_config: LaunchConfigReader | None = None
              ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Activities with name, demangled and class; each step's phase (phase.PHASE_SCHEMA); the
    distinct kernel names (short_id, demangled_id, name, demangled, class by name); and the
    kernels an NVTX range classed (evidence.EVIDENCE_SCHEMA)."""
    names = kernel_names(acts, trace.strings, rules)
    acts = _named(acts, names)
    acts, by_nvtx = _classed_by_nvtx(acts, trace, rules)
    phases = _phase_evidence(acts, _phases_by_name(steps), names, trace, rules, launch_config)
    return _attention_by_phase(acts, phases), phases, names, by_nvtx


def kernel_names(acts: pl.DataFrame, strings: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """The distinct kernel names of the activities, classed by name: short_id, demangled_id,
    name, demangled, class (decided once per name, not per kernel). `strings`: the trace's
    (id, value), joined on (a trace can have 200k distinct names: no Python string per name)."""
    kernels = acts.select("short_id", "demangled_id", "is_kernel").filter(pl.col("is_kernel"))
    # the distinct pairs in id order: each name is then a view into the strings' buffer read
    # front to back, and the rules' regex searches run 3x faster on 200k names than on the
    # same names gathered in the group-by's order (memory locality)
    names = group_by_packed(kernels, ["short_id", "demangled_id"]).sort("short_id", "demangled_id")
    ids = strings["id"]
    if ids.len() and ids.min() >= 0:  # (every reader's strings hold an id once)
        names = names.with_columns(lookup("short_id", ids, strings["value"]).alias("name"),
                                   lookup("demangled_id", ids, strings["value"]).alias("demangled"))
    else:  # a damaged export's negative ids: no lookup table
        text = strings.select(pl.col("id").cast(pl.Int32), "value").unique("id", keep="first", maintain_order=True)
        names = (names.join(text.rename({"id": "short_id", "value": "name"}), on="short_id", how="left",
                            maintain_order="left")
                 .join(text.rename({"id": "demangled_id", "value": "demangled"}), on="demangled_id", how="left",
                       maintain_order="left"))
    return classify_names(names, rules)


def _named(acts: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """Activities with the name, demangled name and class of their kernel name (memops:
    memcpy/memset, class memops), spread from `names` by one small-int slot per activity.

    Names ride along as categoricals: a million kernels share a few hundred names, and a string
    column would hold a copy of a long demangled name per row."""
    n = names.height
    memop_kinds = ["memcpy", "memset"]
    memop_slot = pl.col("memop").to_physical().cast(pl.Int64) + n  # memops: the slots after the names
    ids = ["short_id", "demangled_id"]
    if names["demangled_id"].n_unique() == n and n and names["demangled_id"].min() >= 0:
        # each demangled id has one short name (the usual case): a lookup table indexed by id
        slot = lookup("demangled_id", names["demangled_id"], pl.int_range(n, eager=True))
    elif (key := join_key(acts, names, ids)) is not None:
        slot = key.replace_strict(names.select(key).to_series(), pl.int_range(n, eager=True), default=None,
                                  return_dtype=pl.Int64)
    else:  # ids too wide to pack (a damaged export's): the slot by a join on both
        slot = acts.select(ids).join(names.select(*ids, pl.int_range(n, dtype=pl.Int64).alias("_slot")), on=ids,
                                     how="left", maintain_order="left")["_slot"]
    idx = acts.select(pl.when(pl.col("is_kernel")).then(slot).otherwise(memop_slot)).to_series()

    def mapped(col: str, dtype) -> pl.Series:
        extra = ["memops", "memops"] if col == "class" else memop_kinds
        table = pl.concat([names[col].cast(pl.String), pl.Series(col, extra, dtype=pl.String)]).cast(dtype)
        return table.gather(idx).alias(col)

    name = mapped("name", pl.Categorical)
    # a trace whose kernels' short and demangled names are one string (C kernels, Triton's,
    # nvjet's): the one categorical column twice, not each name made a category twice
    same = names.select((pl.col("name") == pl.col("demangled")).fill_null(False).all()).item() and \
        names["name"].null_count() == 0
    demangled = name.alias("demangled") if same else mapped("demangled", pl.Categorical)
    return acts.with_columns(name, demangled, mapped("class", CLASS_DTYPE))


def _classed_by_nvtx(acts: pl.DataFrame, trace: Trace, rules: RuleSet) -> tuple[pl.DataFrame, pl.DataFrame]:
    """NVTX module ranges around the launching call beat the kernel name ([[nvtx]] rules): the
    activities reclassed, and the kernels that were (evidence.EVIDENCE_SCHEMA)."""
    attributed = nvtx_attribution(
        acts.lazy().filter(pl.col("is_kernel")).select("row", "pid", "tid", "launch_start"),
        trace.nvtx, rules
    )
    if not attributed.height:
        return acts, pl.DataFrame(schema=EVIDENCE_SCHEMA)
    acts = acts.join(attributed, on="row", how="left").with_columns(
        pl.coalesce(pl.col("nvtx_class").cast(CLASS_DTYPE), "class").alias("class")
    ).drop("nvtx_class")
    by_nvtx = (acts.join(attributed.select("row"), on="row", how="semi")
               .select(pl.col("name", "demangled", "class").cast(pl.String)).unique(maintain_order=True)
               .with_columns(class_by=pl.lit("the NVTX range around its launch call ([[nvtx]] rules)")))
    return acts, by_nvtx


def _phases_by_name(steps: pl.DataFrame) -> pl.DataFrame:
    """(step, phase, phase_by): the phase a step's name records (phase_by "name"), else null."""
    shapes = steps.select("step", "name")
    phase_of = {n: step_shape(n).get("phase") for n in shapes["name"].unique().to_list()}
    return pl.DataFrame(
        {"step": shapes["step"], "phase": [phase_of[n] for n in shapes["name"].to_list()]},
        schema={"step": pl.Int64, "phase": pl.String},
    ).with_columns(phase_by=pl.when(pl.col("phase").is_not_null()).then(pl.lit("name")))


def _attention_by_phase(acts: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """Prefill vs decode attention: the step's phase decides, the kernel name only hints."""
    is_attention = pl.col("class").is_in(list(ATTENTION))
    resolved = pl.col("class")
    # a mixed step's attention kernel is the varlen prefill kernel, serving the prompt chunks and
    # the decodes in one launch: its class is the prompt work's (DEFINITIONS.md, "Serving runs")
    for phase, cls in (("prefill", "prefill"), ("mixed", "prefill"), ("decode", "decode")):
        steps_of = phases.filter(pl.col("phase") == phase)["step"]
        if steps_of.len():
            resolved = pl.when(is_attention & pl.col("step").is_in(steps_of.to_list())).then(
                pl.lit(ATTENTION_OF_PHASE[cls], CLASS_DTYPE)).otherwise(resolved)
    return acts.with_columns(resolved.alias("class"))


def _phase_evidence(acts: pl.DataFrame, phases: pl.DataFrame, names: pl.DataFrame, trace: Trace, rules: RuleSet,
                    launch_config: LaunchConfigReader | None) -> pl.DataFrame:
    """phases (step, phase, phase_by) completed by the trace's own evidence (analysis/phase.py)
    for the steps whose name records no phase: PHASE_SCHEMA."""
    out = phases.with_columns(pl.lit(None, pl.String).alias("phase_detail"), pl.lit(None, pl.Int64).alias("tokens"))
    need = phases.filter(pl.col("phase").is_null())["step"].to_list()
    if not need:
        return out.select(list(PHASE_SCHEMA))
    ev = phase_evidence(acts, need, names, trace.gpus, rules, launch_config)
    return (out.join(ev.select("step", pl.col("phase").alias("_p"), pl.col("phase_by").alias("_by"),
                               pl.col("phase_detail").alias("_d"), pl.col("tokens").alias("_t")), on="step", how="left")
            .select("step", pl.coalesce("phase", "_p").alias("phase"), pl.coalesce("phase_by", "_by").alias("phase_by"),
                    pl.col("_d").alias("phase_detail"), pl.col("_t").alias("tokens")))


def _class_tables(a: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(step, class, count, time_ns) and (step, name, demangled, class, count, time_ns)."""
    count_time = (pl.len().cast(pl.Int64).alias("count"), (pl.col("end") - pl.col("start")).sum().alias("time_ns"))
    per_name = group_by_packed(a, ["step", "name", "demangled", "class"], *count_time)
    # each (step, class) sums its names' rows: one group-by of the activities, not two (a
    # name has one class per step, so the per-name table is a partition of the class's rows)
    classes = (
        group_by_packed(per_name, ["step", "class"], pl.col("count").sum(), pl.col("time_ns").sum())
        .select("step", pl.col("class").cast(pl.String), "count", "time_ns")
        .sort("step", "time_ns", "class", descending=[False, True, False])
    )
    kernels = _by_step_and_time(
        per_name.select("step", pl.col("name", "demangled", "class").cast(pl.String), "count", "time_ns"))
    return classes, kernels


def _with_evidence(kernels: pl.DataFrame, class_by: pl.DataFrame) -> pl.DataFrame:
    """`kernels` with a `class_by` column: what classed a kernel when its name did not (null
    where the name did). Joined once here, so that every renderer reads a kernel's evidence
    beside its figures instead of joining it again."""
    if class_by.is_empty():  # the usual case: no join on three strings per kernel row
        return kernels.with_columns(pl.lit(None, class_by.schema["class_by"]).alias("class_by"))
    return kernels.join(class_by, on=["name", "demangled", "class"], how="left", maintain_order="left")


def _by_step_and_time(k: pl.DataFrame) -> pl.DataFrame:
    """`k` sorted by step, time_ns (descending), name, demangled, class. The names only break
    ties of (step, time_ns): one packed integer key sorts the table, and only the tied rows are
    sorted by their names, in the places the key gave them (a trace of 200k distinct names has a
    200k-row table, where sorting on the string keys cost 3x)."""
    full = ("step", "time_ns", "name", "demangled", "class"), [False, True, False, False, False]
    if k.height < 2 or k["step"].null_count() or k["time_ns"].null_count():
        return k.sort(*full[0], descending=full[1])
    # time descending: its distance below the largest
    k = k.with_columns((pl.col("time_ns").max() - pl.col("time_ns")).alias("_t"))
    p = packing([k], ["step", "_t"])
    if p is None:
        return k.drop("_t").sort(*full[0], descending=full[1])
    key = p.expr("_k")
    k = k.with_columns(key).sort("_k")
    tied = k["_k"].is_duplicated()
    if tied.any():
        # a run of equal keys is contiguous: its rows, sorted by key then names, fill its places
        places = tied.arg_true()
        order = (k.with_row_index("_r").filter(tied).sort("_k", "name", "demangled", "class")["_r"])
        k = k[pl.int_range(k.height, dtype=pl.UInt32, eager=True).scatter(places, order)]
    return k.drop("_k", "_t")


def _step_figures(steps: pl.DataFrame, acts: pl.DataFrame, calls: pl.DataFrame,
                  layers: pl.DataFrame) -> pl.DataFrame:
    a = in_steps(acts, "step", "is_kernel", "start", "end", "prev_end", "launch_start", "class", "demangled_id")
    dur = pl.col("end") - pl.col("start")
    per = a.group_by("step").agg(
        n_kernels=pl.col("is_kernel").sum().cast(pl.Int64),
        kernel_time_sum_ns=dur.filter(pl.col("is_kernel")).sum(),
        first_start=pl.col("start").min(),
        last_end=pl.col("end").max(),
        idle_ns=(pl.col("start") - pl.col("prev_end")).clip(lower_bound=0).fill_null(0).sum(),
        first_launch=pl.col("launch_start").min(),
        n_attention=pl.col("class").is_in(list(ATTENTION)).sum(),
    )
    per = per.with_columns(gpu_span_ns=pl.col("last_end") - pl.col("first_start"))
    per = per.with_columns(gpu_busy_ns=pl.col("gpu_span_ns") - pl.col("idle_ns"))

    launches = calls.group_by("step").agg(
        n_launch_calls=pl.len().cast(pl.Int64), launch_call_ns=(pl.col("end") - pl.col("start")).sum())
    s = steps.join(per, on="step", how="inner").join(launches, on="step", how="left").with_columns(
        pl.col("n_launch_calls").fill_null(0), pl.col("launch_call_ns").fill_null(0))

    # step_time: from max(range start | first launch call, previous step's GPU end on the device)
    # to max(range end, last GPU activity).
    begin = pl.coalesce("w_start", "first_launch", "first_start")
    s = s.with_columns(begin=begin).sort("device", "begin")
    s = s.with_columns(prev_gpu_end=pl.col("last_end").shift(1).over("device"))
    s = s.with_columns(
        step_begin=pl.max_horizontal("begin", pl.col("prev_gpu_end").fill_null(pl.col("begin"))),
        step_end=pl.max_horizontal(pl.col("w_end").fill_null(pl.col("last_end")), "last_end"),
    ).with_columns(step_time_ns=pl.max_horizontal(pl.col("step_end") - pl.col("step_begin"), 0))

    s = s.join(layers, on="step", how="left").sort("step")
    return s.select(
        "step", "pid", "device", "delimiter", "name", "phase", "phase_by", "phase_detail", "tokens",
        "tid", "w_start", "w_end",
        "step_begin", "step_end", "first_start", "last_end",
        "step_time_ns", "n_kernels", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
        "n_launch_calls", "launch_call_ns", "layers", "kernels_per_layer", "n_attention",
    )


def step_launch_calls(steps: pl.DataFrame, acts: pl.DataFrame, api: pl.DataFrame,
                      window_steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every launch call of every step: (step, pid, tid, corr, start, end, api_name).

    Window-delimited steps own the launch calls inside their host window (on their thread, or
    any thread of the process for capture ranges); a window split over several devices shares
    its calls with each of its steps. Other steps own the calls that launched their activities.
    """
    parts = []
    windowed = steps.filter(pl.col("w_start").is_not_null())
    if windowed.height:
        # a window split over several devices is several steps: its calls go to each of them
        steps_of = window_steps if window_steps is not None else (
            acts.select("window", "step").filter(pl.col("window").is_not_null()).unique())
        hit = api.select("window", "pid", "tid", "corr", "start", "end", "api_name", "is_launch")
        if steps_of["window"].n_unique() == steps_of.height:  # one step per window: a lookup
            # a range that launched no recorded GPU work has no step: its calls are dropped.
            # The call frame is copied once: filtered when the step windows follow one another
            # (calls in start order are then in step order), else gathered in (step, start)
            # order by row number (a TP trace's windows overlap across devices: filtering, then
            # sorting, copied a million rows twice)
            step = lookup("window", steps_of["window"], steps_of["step"]).alias("step")
            keep = pl.col("is_launch") & pl.col("step").is_not_null()
            w = windowed.select("step", "w_start", "w_end").sort("step")
            if (w["w_start"].slice(1) >= w["w_end"].slice(0, w.height - 1)).all():
                hit = hit.with_columns(step).filter(keep)
            else:
                pick = sorted_by(api.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i"), step,
                                            "start", "is_launch").filter(keep), "step", "start")
                hit = hit.drop("window", "is_launch").select(pl.all().gather(pick["_i"]))
                hit = hit.with_columns(pick["step"])
        else:
            hit = hit.filter(pl.col("is_launch") & pl.col("window").is_not_null()).join(steps_of, on="window")
        parts.append(hit.select("step", "pid", "tid", "corr", "start", "end", "api_name"))
    bare = steps.filter(pl.col("w_start").is_null()).select("step")
    if bare.height:
        calls = (
            acts.join(bare, on="step", how="semi").filter(pl.col("launch_start").is_not_null())
            .select("step", "pid", "corr").unique()
            .join(api.filter(pl.col("is_launch")).select("pid", "tid", "corr", "start", "end", "api_name"),
                  on=["pid", "corr"])
            .select("step", "pid", "tid", "corr", "start", "end", "api_name")
        )
        parts.append(calls)
    if not parts:
        return pl.DataFrame(schema={"step": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "corr": pl.Int64,
                                    "start": pl.Int64, "end": pl.Int64, "api_name": pl.String})
    return sorted_by(pl.concat(parts, how="vertical_relaxed"), "step", "start")


@functools.lru_cache(maxsize=4096)
def _pattern_of(seq: bytes) -> tuple:
    """layer_pattern of a step's kernel sequence (int64 name keys, as bytes): a pure function of
    the sequence, kept for the next step of the same sequence, in this trace or the next window
    of it (analysis/windows.py: each window meets a run's few distinct step sequences again)."""
    return layer_pattern(np.frombuffer(seq, dtype=np.int64))


def _layers(acts: pl.DataFrame, keys: dict[int, int] | None = None) -> pl.DataFrame:
    """(step, layers, kernels_per_layer, layer_start) of each step's kernel sequence; `keys`
    maps a name id to the id it is compared as (layers.layer_keys)."""
    seqs = (
        acts.select("step", "demangled_id", "is_kernel").filter(pl.col("is_kernel"))
        .group_by("step", maintain_order=True)
        .agg(pl.col("demangled_id").alias("seq"))
        .with_columns(sig=pl.col("seq").hash())
    )
    uniq = seqs.unique("sig", keep="first")
    if not keys:
        # a sequence without a repeated name has no period (layer_pattern's own first test): such
        # steps (a trace whose every kernel has its own name) never reach Python
        uniq = uniq.filter(pl.col("seq").list.n_unique() < pl.col("seq").list.len())
    src = np.array(sorted(keys or {}), dtype=np.int64)
    dst = np.array([keys[k] for k in src.tolist()], dtype=np.int64) if keys else src
    found = {}
    for sig, seq in zip(uniq["sig"].to_list(), uniq["seq"].to_list()):
        seq = np.asarray(seq, dtype=np.int64)
        if src.size:
            at = np.clip(np.searchsorted(src, seq), 0, src.size - 1)
            seq = np.where(src[at] == seq, dst[at], seq)
        found[sig] = _pattern_of(seq.tobytes())
    return seqs.select(
        "step",
        *[pl.col("sig").replace_strict({k: v[i] for k, v in found.items()}, default=None,
                                       return_dtype=pl.Int64).alias(col)
          for i, col in enumerate(("layers", "kernels_per_layer", "layer_start"))],
    )
