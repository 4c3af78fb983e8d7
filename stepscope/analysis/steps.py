"""Step segmentation: which activities (kernels and memops) belong to which engine step.

Delimiters, in order of preference, chosen per process (DEFINITIONS.md, "A step and its kernels"):
  nvtx     an NVTX range whose name matches the step regex, on the launching thread
  schedule vLLM's scheduler ranges (`schedule: …`): one engine iteration to the next
  engine   vLLM's engine loop itself: one step per input preparation, cut after each output
  capture  a cudaProfilerStart → cudaProfilerStop capture range
  graph    one cudaGraphLaunch replay (to the next replay on the same thread)
  period   the repeat period of the kernel sequence, for traces without markers
  trace    no structure found: the whole process/device is one step (with a warning)
A capture range (or a marker-free process) that holds the same whole-step kernel sequence
several times is split into those steps (split_repeats): `sync` when every cut sits at a host
synchronization (the sampled token's copy to the host), `period` otherwise.
A kernel belongs to a step when its launching call (same process, same correlationId) starts
inside the step's host window. Steps are per process and per device.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope import apinames
from stepscope.analysis.frames import FAR_END, group_by_packed, join_key, lookup, small_ids, sorted_by
from stepscope.analysis.lazy_numpy import np
from stepscope.analysis.notes import EMPTY_STEP_RANGES, ONE_STEP_STREAMS, note
from stepscope.errors import InputError
from stepscope.patterns import PatternError, UserPattern, ours

# vLLM's step range in both of its spellings: `execute_context_2(2030)_generation_18(18)` and, with
# the profiler's detailed_trace_annotation, `execute_2048_context_2(sq2030sk…)_generation_18(sq18…)`
DEFAULT_STEP_REGEX = (r"^(execute_(\d+_)?context_\d+\([^)]*\)_generation_\d+\([^)]*\)|step(\s.*)?"
                      r"|ProfilerStep#\d+)$")

MEMOP_DTYPE = pl.Enum(["memcpy", "memset"])

STEP_COLS = ("step", "pid", "device", "delimiter", "name", "tid", "w_start", "w_end")


def api_names(name_ids: pl.Series, strings: dict[int, str], ids: pl.Series | None = None) -> pl.Series:
    """Categorical API names for a column of name ids: decoded once per distinct id (`ids`,
    when the caller has them), then one gather (a trace calls a few dozen APIs a million times)."""
    ids = (name_ids.unique() if ids is None else ids).drop_nulls().sort()
    table = pl.Series("api_name", [strings.get(i, "") for i in ids.to_list()], dtype=pl.String).cast(pl.Categorical)
    if ids.len() and small_ids(ids.min(), ids.max()):
        # string ids are small integers: a lookup table indexed by id
        slot = name_ids.to_frame("id").select(lookup("id", ids, pl.int_range(ids.len(), eager=True))).to_series()
    else:
        slot = name_ids.to_frame("id").select(pl.col("id").replace_strict(
            ids, pl.int_range(ids.len(), eager=True), default=None, return_dtype=pl.UInt32)).to_series()
    return table.gather(slot)


def api_flags(api: pl.DataFrame, strings: dict[int, str]) -> pl.DataFrame:
    """API calls with their decoded name and launch / sync / graph / profiler flags, decided
    once per distinct name id and spread with set lookups."""
    ids = api["name_id"].unique().drop_nulls()
    names = api_names(api["name_id"], strings, ids)
    vals = [strings.get(i, "") for i in ids.to_list()]

    def flag(test, alias: str) -> pl.Expr:
        having = [i for i, n in zip(ids.to_list(), vals) if test(n)]
        return pl.col("name_id").is_in(having).fill_null(False).alias(alias)

    return api.with_columns(names.alias("api_name"), *(flag(test, alias) for alias, test in API_FLAGS.items()))


# what each flag of api_flags says of a call, by its name
API_FLAGS = {
    "is_launch": lambda n: n.startswith(apinames.LAUNCH),
    "is_graph_launch": lambda n: n.startswith(apinames.GRAPH_LAUNCH),
    "is_copy": lambda n: n.startswith(apinames.COPY_SET),
    "is_graph_capture": lambda n: n.startswith(apinames.GRAPH_CAPTURE),
    "is_sync": lambda n: bool(n.startswith(apinames.SYNC) or apinames.BLOCKING_COPY.match(n)),
    "is_prof_start": lambda n: n.startswith(apinames.PROFILER_START),
    "is_prof_stop": lambda n: n.startswith(apinames.PROFILER_STOP),
}


def trace_api_flags(trace) -> pl.DataFrame:
    """api_flags of `trace`'s API calls, their names decoded from its strings (only the calls'
    names: the kernels' are joined on as a frame, inventory.kernel_names)."""
    ids = trace.api["name_id"].unique().drop_nulls()
    names = trace.strings.filter(pl.col("id").is_in(ids.implode()))
    return api_flags(trace.api, dict(zip(names["id"].to_list(), names["value"].to_list())))


def activities(kernels: pl.DataFrame, memops: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """Kernels and memops in one frame, each joined to its launching call on (pid, corr).

    The launching call brings its thread, times, name and the step window it started in (the
    `window` column of `api`, when present)."""
    k = kernels.with_columns(pl.lit(True).alias("is_kernel"), pl.lit(None, MEMOP_DTYPE).alias("memop"),
                             pl.lit(None, pl.Int64).alias("bytes"), pl.lit(None, pl.Int32).alias("copy_kind"))
    if memops.height:
        m = memops.rename({"kind": "memop"}).with_columns(pl.lit(False).alias("is_kernel"))
        m = m.select([pl.col(c) if c in m.columns else pl.lit(None, t).alias(c) for c, t in k.schema.items()])
        acts = sorted_by(pl.concat([k, m.cast(k.schema)]), "start")
    else:
        acts = k
    # correlationId is unique only within a process: join on (pid, corr), packed into one
    # integer key, which hashes faster (and merges when both sides come sorted)
    window = [pl.col("window")] if "window" in api.columns else [pl.lit(None, pl.UInt32).alias("window")]
    launch = (pl.col("start").alias("launch_start"), pl.col("end").alias("launch_end"),
              pl.col("api_name").alias("launch_api"), *window)
    key = join_key(acts, api, ["pid", "corr"])
    if key is None:
        # ids a packed key would not hold exactly (a damaged export's correlation ids spanning
        # 2^63): the two-column join, slower but exact
        calls = api.select("pid", "corr", "tid", *launch).unique(["pid", "corr"], keep="first", maintain_order=True)
        acts = acts.join(calls, on=["pid", "corr"], how="left", maintain_order="left")
        return acts.with_row_index("row")
    calls = api.select(key, "tid", *launch)
    acts = acts.with_columns(key)
    # CUPTI numbers calls in call order and nsys writes both tables in start order, so in a
    # single-stream process both keys usually come sorted: then polars merges instead of hashing
    if calls["_key"].null_count() == 0 and acts["_key"].null_count() == 0 and calls["_key"].is_sorted():
        if calls.height > 1 and (calls["_key"].diff() == 0).any():
            calls = calls.unique("_key", keep="first", maintain_order=True)
        calls = calls.with_columns(pl.col("_key").set_sorted())
        if acts["_key"].is_sorted():
            acts = acts.with_columns(pl.col("_key").set_sorted())
    elif calls["_key"].n_unique() != calls.height:  # keep one call per (pid, corr)
        calls = calls.unique("_key", keep="first", maintain_order=True)
    acts = acts.join(calls, on="_key", how="left", maintain_order="left").drop("_key")
    return acts.with_row_index("row")


@dataclass
class Segmentation:
    steps: pl.DataFrame  # STEP_COLS
    acts: pl.DataFrame | None  # activities with a `step` column (null = outside every step)
    warnings: list  # sentences and analysis/notes.py's Notes, in order
    window_steps: pl.DataFrame | None = None  # window, step: the steps each window became


def _step_pattern(step_regex: str | None):
    if step_regex is None:
        return ours(DEFAULT_STEP_REGEX)
    try:
        return UserPattern(step_regex, "--step-regex")
    except PatternError as e:
        raise InputError(f"bad --step-regex {step_regex!r}: {e.reason}") from None


def _windows_nvtx(nvtx: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    pat = _step_pattern(step_regex)  # a bad pattern fails even on a trace without NVTX
    if nvtx.is_empty():
        return _no_windows()
    names = nvtx.select("name").unique().drop_nulls()
    keep = names.filter(pl.Series([bool(pat.search(n)) for n in names["name"].to_list()], dtype=pl.Boolean))
    w = nvtx.join(keep, on="name", how="semi").sort("pid", "tid", "start")
    # Nested step ranges (torch.profiler's ProfilerStep#N around a named `step ...` range):
    # the innermost one is the step; a range that holds the next one on its thread is dropped.
    holds_next = (pl.col("end").shift(-1).over("pid", "tid") <= pl.col("end")) & (
        pl.col("start").shift(-1).over("pid", "tid") >= pl.col("start"))
    w = w.filter(~holds_next.fill_null(False))
    w = w.select("pid", "tid", pl.col("start").alias("w_start"), pl.col("end").alias("w_end"),
                 "name", pl.lit("nvtx").alias("delimiter"))
    return _extend_vllm_windows(w, nvtx)


# vLLM's own scheduler ranges (VLLM_NVTX_SCOPES_FOR_PROFILING=1): the next engine iteration
VLLM_SCHEDULE_PREFIX = "schedule:"


def _extend_vllm_windows(w: pl.DataFrame, nvtx: pl.DataFrame) -> pl.DataFrame:
    """vLLM's `execute_context_…` range covers the worker's execute_model only; the LM head and
    sampling are launched by sample_tokens after the range closes, on the same thread. A vLLM
    step therefore runs from its range's start to the next engine iteration on that thread: its
    next `schedule: …` range or the next step range; the last one to the end of the process's
    recorded work (closed like an open capture range)."""
    is_vllm = pl.col("name").str.contains(_VLLM.pattern)
    if w.is_empty() or not w.select(is_vllm.any()).item():
        return w
    nxt = nvtx.filter(pl.col("name").str.starts_with(VLLM_SCHEDULE_PREFIX)
                      | pl.col("name").str.contains(_VLLM.pattern))
    nxt = nxt.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
                     pl.col("start").alias("_next")).sort("_next")
    v = w.with_row_index("_i").filter(is_vllm).with_columns(
        pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64)).sort("w_end")
    v = v.join_asof(nxt, left_on="w_end", right_on="_next", by=["pid", "tid"],
                    strategy="forward", check_sortedness=False)
    ends = dict(zip(v["_i"].to_list(), v["_next"].fill_null(OPEN_END).to_list()))
    idx = w.with_row_index("_i")["_i"].to_list()
    new_end = [ends.get(i) for i in idx]
    return w.with_columns(pl.Series("_e", new_end, dtype=pl.Int64)).with_columns(
        pl.coalesce("_e", "w_end").alias("w_end")).drop("_e")


def _windows_schedule(nvtx: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """Engine iterations from vLLM's own scheduler ranges (VLLM_NVTX_SCOPES_FOR_PROFILING=1,
    no step range): the `schedule: …` ranges of one thread with no launch call of the process
    between them are one iteration's scheduling; the iteration runs from its first one to the
    next iteration's (the last to the end of the process's recorded work). The work before a
    process's first scheduling is a step only inside a capture range opened before it (the
    capture began in the middle of an iteration); otherwise it is the engine's start-up, in no
    step. An iteration that launched nothing is no step."""
    rows = []
    calls = _launch_calls(api)
    for pid, tid, starts in _iteration_starts(nvtx, calls):
        mine = calls.filter(pl.col("pid") == pid)
        ends = np.concatenate((starts[1:] - 1, [OPEN_END]))
        opened = mine.filter(pl.col("is_prof_start") & (pl.col("end") < int(starts[0])))["end"]
        if opened.len():
            rows.append((pid, None, int(opened.max()), int(starts[0]) - 1, "capture start to the first schedule",
                         "schedule"))
        for i, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist())):
            rows.append((pid, None, lo, hi, f"schedule #{i + 1}", "schedule"))
    if not rows:  # no scheduler range
        return _no_windows()
    w = pl.DataFrame(rows, schema=WINDOW_SCHEMA, orient="row")
    # keep the iterations that launched something
    lc = calls.filter(pl.col("is_launch")).select("pid", "start").sort("pid", "start")
    hit = w.with_row_index("_i").sort("w_start").join_asof(
        lc.rename({"start": "_call"}), left_on="w_start", right_on="_call", by="pid", strategy="forward",
        check_sortedness=False)
    keep = hit.filter(pl.col("_call").is_not_null() & (pl.col("_call") <= pl.col("w_end")))["_i"]
    return w.with_row_index("_i").filter(pl.col("_i").is_in(keep.implode())).drop("_i")


def _launch_calls(api: pl.DataFrame) -> pl.DataFrame:
    """The calls an iteration is told by (pid, start, end, is_launch: a launch or a copy,
    is_prof_start) of api_flags' `api`: its launches and copies, and the capture starts."""
    return api.select(pl.col("pid").cast(pl.Int64), "start", "end", (pl.col("is_launch") | pl.col("is_copy")),
                      "is_prof_start").filter(pl.col("is_launch") | pl.col("is_prof_start"))


def _iteration_starts(nvtx: pl.DataFrame, calls: pl.DataFrame):
    """(pid, tid, the starts of its iterations (numpy)) per thread with `schedule: …` ranges:
    the first of its ranges, then each with a launch call of its process since the one before
    (`calls`: _launch_calls')."""
    if nvtx.is_empty():
        return
    sched = nvtx.filter(pl.col("name").str.starts_with(VLLM_SCHEDULE_PREFIX)).select(
        pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "start").sort("pid", "tid", "start")
    if sched.is_empty():
        return
    for (pid, tid), grp in sched.group_by(["pid", "tid"], maintain_order=True):
        launch = np.sort(calls.filter((pl.col("pid") == pid) & pl.col("is_launch"))["start"].to_numpy())
        at = grp["start"].to_numpy()
        before = np.searchsorted(launch, at, side="left")  # launches of the process before each range
        first = np.concatenate(([True], before[1:] > before[:-1]))
        yield pid, tid, at[first]


def iteration_starts(nvtx: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """(pid, tid, start, i) of every engine iteration's first `schedule: …` range, those that
    launched nothing included, i its place on its thread (`schedule #i+1`); api: api_flags'."""
    rows = [(pid, tid, int(x), i) for pid, tid, starts in _iteration_starts(nvtx, _launch_calls(api))
            for i, x in enumerate(starts)]
    return pl.DataFrame(rows, schema={"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "i": pl.Int64},
                        orient="row")


# vLLM's engine loop without any range (model runner V2): each iteration prepares its inputs with
# a few Triton kernels of its own before the forward, and ends by copying the sampled tokens to
# the host and updating its state after them
VLLM_INPUT_PREP = ours(r"^_(prepare_pos_seq_lens|prepare_prefill_inputs|prepare_inputs|"
                       r"combine_sampled_and_draft_tokens|gather_block_tables|compute_slot_mappings?)_kernel$")
VLLM_OUTPUT = ours(r"^_(post_update|get_num_sampled_and_rejected)_kernel$")
# SQL's GLOB of every name the two patterns take: what a long run's light read selects by
ENGINE_MARK_GLOB = "_*_kernel"


def _engine_marks(trace, api: pl.DataFrame, pids: set[int]) -> pl.DataFrame | None:
    """Launch calls of vLLM's input preparation and output side (pid, start, end, name, prep):
    the input-preparation kernels, the output kernels and the device-to-host copies."""
    k = trace.kernels
    if k.is_empty() or not pids:
        return None
    ids = k["short_id"].unique().drop_nulls()
    names = trace.strings.filter(pl.col("id").is_in(ids.implode()))
    prep = [i for i, v in zip(names["id"].to_list(), names["value"].to_list()) if VLLM_INPUT_PREP.search(v or "")]
    if not prep:
        return None
    out = [i for i, v in zip(names["id"].to_list(), names["value"].to_list()) if VLLM_OUTPUT.search(v or "")]
    marks = [k.filter(pl.col("short_id").is_in(prep + out) & pl.col("pid").is_in(list(pids))).select(
        "pid", "corr", pl.col("short_id").alias("name"), pl.col("short_id").is_in(prep).alias("prep"))]
    if "copy_kind" in trace.memops.columns:
        marks.append(trace.memops.filter((pl.col("copy_kind") == DEVICE_TO_HOST) & pl.col("pid").is_in(list(pids)))
                     .select("pid", "corr", pl.lit(None, pl.Int32).alias("name"), pl.lit(False).alias("prep")))
    marks = pl.concat(marks)
    calls = api.filter(pl.col("corr").is_in(marks["corr"].unique().implode())).select(
        "pid", "corr", "start", "end").unique(["pid", "corr"], keep="first")
    return marks.join(calls, on=["pid", "corr"], how="inner").select(
        pl.col("pid").cast(pl.Int64), "start", "end", "name", "prep").sort("pid", "start")


@dataclass
class EngineLoop:
    """One process's engine loop as its marks (_engine_marks) and capture calls tell it: the
    anchors `t` (its preparation's launches after the start-up's `floor`), the anchor before each
    (`prev`: the floor for the first), whether an output lies between the two (`has_out`) and
    where the search for each step's first call begins (`after`: that output's end, or the
    floor); `first_lonely`: the first step begins after the longest pause since the floor."""

    floor: int
    t: np.ndarray
    prev: np.ndarray
    has_out: np.ndarray
    after: np.ndarray
    first_lonely: bool
    captured: bool  # a graph capture before its steps
    opened: bool  # a capture range opened before them

    def lonely(self) -> np.ndarray:
        """The anchors with no output since the one before: their step begins before the longest
        host pause between the two."""
        lonely = np.flatnonzero(~self.has_out[1:]) + 1
        return np.concatenate(([0], lonely)) if self.first_lonely else lonely


def engine_loop(m: pl.DataFrame, mine: pl.DataFrame) -> EngineLoop | None:
    """The engine loop of the process whose marks are `m` and API calls (api_flags') `mine` (of
    them only its graph captures and profiler starts are read); None: no preparation after its
    start-up."""
    floor = -1
    cap = mine.filter(pl.col("is_graph_capture"))["end"]
    if cap.len():
        floor = int(cap.max())
    opened = mine.filter(pl.col("is_prof_start"))["end"]
    prep = m.filter(pl.col("prep"))
    if prep.is_empty():
        return None  # device-to-host copies, no input preparation: not vLLM's engine loop
    counts = prep.group_by("name").agg(pl.len().alias("n"), pl.col("start").min().alias("first"))
    mode = counts.group_by("n").agg(pl.len().alias("k")).sort("k", "n", descending=True)["n"][0]
    anchor = counts.filter(pl.col("n") == mode).sort("first")["name"][0]
    t = prep.filter(pl.col("name") == anchor)["start"].to_numpy()
    if opened.len():
        floor = max(floor, int(opened.min()))
    t = t[t > floor]
    if t.size == 0:
        return None
    outs = m.filter(~pl.col("prep"))
    out_start, out_end = outs["start"].to_numpy(), outs["end"].to_numpy()
    # per anchor: the last output call between the previous anchor (the floor for the first)
    # and it; the step's first launch or copy call is searched for after that output
    prev = np.concatenate(([floor], t[:-1]))
    j = np.searchsorted(out_start, t, side="left") - 1
    has_out = (j >= 0) & (out_start[np.maximum(j, 0)] > prev) if out_start.size else np.zeros(t.size, bool)
    after = np.where(has_out, out_end[np.maximum(j, 0)] if out_start.size else floor, floor)
    # no output between the last graph capture and the first preparation (no sampler warm-up
    # after the capture): the first step, too, begins after the longest host pause since the
    # capture (a JIT compilation, a KV-cache set-up), not at the capture
    first_lonely = bool(not has_out[0] and cap.len() and not opened.len())
    return EngineLoop(floor, t, prev, has_out, after, first_lonely, bool(cap.len()), bool(opened.len()))


def engine_windows(trace, api: pl.DataFrame, pids: set[int], launched=None) -> pl.DataFrame:
    """Engine steps from vLLM's loop itself, for processes with no range at all: one step per
    occurrence of its input preparation (the preparation kernel whose count is the most common
    among them, first launched first), from just after the previous step's last output (its last
    device-to-host copy or output kernel) to just after its own. Occurrences before the end of
    the process's last graph capture (or before its capture range opened) are start-up, in no
    step. The last step of a process is open (OPEN_END: find_windows closes it).

    `trace` needs of its kernels only those of the preparation and output names, of its memops
    the device-to-host copies; of its API calls (`api`: api_flags') those engine_calls_needed
    names: what a long run's light read holds (by_windows.py). `launched(lo, hi)`: the kernels
    launched by the calls that start in [lo, hi] (a warm-up run's are counted; by default
    trace.kernels')."""
    marks = _engine_marks(trace, api, pids)
    if marks is None or marks.is_empty():
        return _no_windows()
    # calls in start order, those of one start in the calls' order: the step's first call and the
    # pause before a call are the same whichever calls around them a light read left out
    work = api.filter(pl.col("is_launch") | pl.col("is_copy")).select(
        pl.col("pid").cast(pl.Int64), "start", "end").sort("pid", "start", maintain_order=True)
    rows = []
    for (pid,), m in marks.group_by(["pid"], maintain_order=True):
        mine = api.filter(pl.col("pid") == pid)
        loop = engine_loop(m, mine)
        if loop is None:
            continue
        t, prev = loop.t, loop.prev
        w = work.filter(pl.col("pid") == pid)
        w_start, w_end = w["start"].to_numpy(), w["end"].to_numpy()
        # the first launch or copy call after each step's last output
        nxt = np.searchsorted(w_start, loop.after, side="right")
        cand = w_start[np.minimum(nxt, w_start.size - 1)]
        begin = np.where((nxt < w_start.size) & (cand <= t), cand, t)
        starts = begin.tolist()
        for i in loop.lonely():
            # no output between two preparations: before the longest host pause between them
            inside = np.flatnonzero((w_start > prev[i]) & (w_start <= t[i]))
            if not inside.size:
                continue  # no launch between the two preparations (two recorded at one time): nothing to move
            pause = w_start[inside] - np.concatenate(([w_end[inside[0] - 1] if inside[0] else prev[i]],
                                                       w_end[inside[:-1]]))
            starts[i] = int(w_start[inside[np.argmax(pause)]])
        ends = [s - 1 for s in starts[1:]] + [OPEN_END]
        lead = _warmup_runs(trace, mine, starts, ends, w_start, w_end, launched)
        if lead is None:
            # every iteration is a warm-up run: after a graph capture, outside any capture range,
            # that is the start-up's end with no engine step after it (the traffic not recorded);
            # otherwise keep them all rather than call the run start-up
            lead = len(starts) if loop.captured and not loop.opened else 0
        for i, (lo, hi) in enumerate(zip(starts[lead:], ends[lead:])):
            rows.append((pid, None, lo, hi, f"engine step #{i + 1}", "engine"))
    return pl.DataFrame(rows, schema=WINDOW_SCHEMA, orient="row") if rows else _no_windows()


# a host pause this long between two CUDA calls of one iteration is compilation (Triton's JIT,
# Inductor, autotuning), which only the start-up does; under nsys a serving step's longest is ~10 ms
COMPILE_PAUSE_NS = 500_000_000
# a layer stack launches some kernel once per layer: at least this many times
FORWARD_REPEATS = 4
# a whole-device synchronization: what vLLM's warm-up and graph capture end with; its serving loop
# waits on events and streams
DEVICE_SYNC = ("cudaDeviceSynchronize", "cuCtxSynchronize")


def _warmup_runs(trace, calls: pl.DataFrame, starts: list[int], ends: list[int], w_start: np.ndarray,
                 w_end: np.ndarray, launched=None) -> int | None:
    """How many of the leading engine iterations are the start-up's warm-up runs (vLLM's dummy
    and sampler warm-up runs after graph capture): each one that compiles (a host pause of at
    least COMPILE_PAUSE_NS between its CUDA calls), synchronizes the whole device, or runs no
    forward (no graph replay and no kernel launched FORWARD_REPEATS times), up to the first that
    does none of these; None when every one does."""
    pid = calls["pid"][0] if calls.height else None
    for i, (lo, hi) in enumerate(zip(starts, ends)):
        inside = (w_start >= lo) & (w_start <= hi)
        s, e = w_start[inside], w_end[inside]
        pause = int((s[1:] - np.maximum.accumulate(e)[:-1]).max()) if s.size > 1 else 0
        if pause >= COMPILE_PAUSE_NS:
            continue
        mine = calls.filter((pl.col("start") >= lo) & (pl.col("start") <= hi))
        if mine["api_name"].cast(pl.String).str.contains("^(" + "|".join(DEVICE_SYNC) + ")").any():
            continue
        if mine["is_graph_launch"].any():
            return i
        k = trace.kernels if launched is None else launched(lo, hi)
        k = k.filter((pl.col("pid") == pid) & pl.col("corr").is_in(mine["corr"].implode()))
        if k.height and int(k["demangled_id"].value_counts()["count"].max()) >= FORWARD_REPEATS:
            return i
    return None  # no iteration looks like a step: the caller decides


def _windows_capture(api: pl.DataFrame) -> pl.DataFrame:
    marks = api.select("pid", "start", "end", "is_prof_start", "is_prof_stop").filter(
        pl.col("is_prof_start") | pl.col("is_prof_stop")).sort("start")
    if marks.is_empty():
        return _no_windows()
    rows = []
    for pid, grp in marks.group_by("pid"):
        open_at = None
        for start, end, is_start in zip(grp["start"], grp["end"], grp["is_prof_start"]):
            if is_start:
                open_at = end
            elif open_at is not None:
                rows.append((pid[0], None, open_at, start, "capture range", "capture"))
                open_at = None
        if open_at is not None:
            # nsys --capture-range=cudaProfilerApi stops recording at the stop call, so the
            # export often holds the start alone: the range runs to the end of the trace
            rows.append((pid[0], None, open_at, OPEN_END, "capture range", "capture"))
    return pl.DataFrame(rows, schema=WINDOW_SCHEMA, orient="row") if rows else _no_windows()


def _windows_graph(api: pl.DataFrame) -> pl.DataFrame:
    g = api.select("pid", "tid", "start", "end", "api_name", "is_graph_launch").filter(
        pl.col("is_graph_launch")).sort("pid", "tid", "start")
    if g.is_empty():
        return _no_windows()
    nxt = pl.col("start").shift(-1).over("pid", "tid")
    return g.select(
        "pid", "tid", pl.col("start").alias("w_start"),
        # a replay's window runs to the next replay on the thread (the last one: to its own end,
        # widened later to cover what it launched)
        (pl.coalesce(nxt - 1, pl.col("end"))).alias("w_end"),
        pl.col("api_name").cast(pl.String).alias("name"), pl.lit("graph").alias("delimiter"),
    )


OPEN_END = FAR_END  # the end of a capture range whose stop call was not recorded
WINDOW_SCHEMA = {"pid": pl.Int64, "tid": pl.Int64, "w_start": pl.Int64, "w_end": pl.Int64,
                  "name": pl.String, "delimiter": pl.String}


def _no_windows() -> pl.DataFrame:
    return pl.DataFrame(schema=WINDOW_SCHEMA)


def window_of(api: pl.DataFrame, windows: pl.DataFrame) -> pl.Series:
    """Per API call (in api's order): the `window` it started in, or null.

    A window with a tid holds that thread's calls; one without (a capture range) any thread's
    of its process. Windows of one key do not overlap, so a call is in the last window of its
    key that starts at or before it, if that window has not ended: one binary search per call.
    """
    out = np.full(api.height, -1, dtype=np.int64)
    if windows.height and api.height:
        pid, tid, at = (api[c].to_numpy() for c in ("pid", "tid", "start"))
        sorted_at = bool(api["start"].is_sorted())
        for (w_pid, w_tid), w in windows.sort("w_start").group_by(["pid", "tid"], maintain_order=True):
            mine = (pid == w_pid) & (tid == w_tid) if w_tid is not None else pid == w_pid
            rows = None if mine.all() else np.flatnonzero(mine)
            t = at if rows is None else at[rows]
            starts, ends, ids = (w[c].to_numpy() for c in ("w_start", "w_end", "window"))
            if sorted_at:
                # calls in start order: each window holds one run of them, found by two binary
                # searches per window rather than one per call
                lo = np.searchsorted(t, starts, side="left")
                hi = np.maximum(np.searchsorted(t, ends, side="right"), lo)
                n = hi - lo
                pos = np.arange(n.sum()) + np.repeat(lo - (np.cumsum(n) - n), n)
                out[pos if rows is None else rows[pos]] = np.repeat(ids, n)
            else:
                j = np.searchsorted(starts, t, side="right") - 1
                jj = np.maximum(j, 0)
                hit = (j >= 0) & (t <= ends[jj])
                out[np.flatnonzero(hit) if rows is None else rows[hit]] = ids[jj[hit]]
    s = pl.Series("window", out)
    return s.set(s < 0, None).cast(pl.UInt32)


def find_period(keys: np.ndarray, min_repeats: int = 3, min_match: float = 0.8) -> int | None:
    """Smallest repeat period of a key sequence, anchored on rare keys; None when aperiodic."""
    n = len(keys)
    if n < 2 * min_repeats:
        return None
    uniq, counts = np.unique(keys, return_counts=True)
    order = np.argsort(counts, kind="stable")
    tried: set[int] = set()
    best = None
    for idx in order:
        if counts[idx] < min_repeats:
            continue
        pos = np.flatnonzero(keys == uniq[idx])
        p = int(np.median(np.diff(pos)))
        if p <= 0 or p in tried or p > n // 2:
            continue
        tried.add(p)
        if np.mean(keys[:-p] == keys[p:]) >= min_match:
            best = p if best is None else min(best, p)
        if len(tried) >= 12:
            break
    return best


# A whole step repeated: the rarest kernel name occurs K >= 2 times and nearly every kernel's
# name occurs a multiple of K times (extra input updates between steps tolerated), and the K
# pieces hold the same kernels (weighted Jaccard of name counts against the largest).
REPEAT_MULTIPLE = 0.9
REPEAT_ALIKE = 0.9
MIN_STEP_KERNELS = 4


def split_repeats(keys: np.ndarray, is_kernel: np.ndarray, gap_before: np.ndarray,
                  sync_pos: np.ndarray, copy_pos: np.ndarray | None = None) -> tuple[np.ndarray, bool] | None:
    """Where a sequence that repeats one whole step K times is cut into its steps.

    keys: one name id per activity in launch order (memops any key); gap_before: the idle
    time before each activity; sync_pos: for each host synchronization, the index of the
    first activity launched after it; copy_pos: the indices of the device-to-host copies (the
    sampled tokens' way out). Returns (the K - 1 indices where a step begins, whether every
    cut is at a synchronization), or None when the sequence is not K whole steps.

    Anchors are the K occurrences of one of the rarest names (the one spaced most evenly):
    between two consecutive anchors lies one step boundary, placed at a synchronization when
    one falls between them (the widest gap among those); else just after the last
    device-to-host copy between them; else as far before the anchor as the first anchor lies
    from the sequence's start (every step begins the way the first one does). Should those
    cuts not give K alike steps, the boundary without a synchronization sits at the widest
    idle gap between the anchors instead.
    """
    kern = keys[is_kernel]
    if kern.size < 2 * MIN_STEP_KERNELS:
        return None
    names, inverse, counts = np.unique(kern, return_inverse=True, return_counts=True)
    k = int(counts.min())
    if k < 2 or kern.size < k * MIN_STEP_KERNELS:
        return None
    if (counts[inverse] % k == 0).mean() < REPEAT_MULTIPLE:
        return None
    rows = np.flatnonzero(is_kernel)
    best, spread = None, None
    for name in names[counts == k]:
        at = rows[kern == name]
        d = np.diff(at)
        s = d.std() / max(d.mean(), 1)
        if spread is None or s < spread:
            best, spread = at, s
    syncs = np.unique(sync_pos[(sync_pos > 0) & (sync_pos < keys.size)])
    after_copy = np.unique(np.asarray(copy_pos if copy_pos is not None else [], dtype=np.int64) + 1)
    depth = int(best[0])  # how far into the first step its anchor lies
    for structural in (True, False):
        cuts, at_sync = [], True
        for lo, hi in zip(best[:-1], best[1:]):
            cand = syncs[(syncs > lo) & (syncs <= hi)]
            if cand.size:
                cuts.append(int(cand[np.argmax(gap_before[cand])]))
                continue
            at_sync = False
            if structural:
                out = after_copy[(after_copy > lo) & (after_copy <= hi)]
                if out.size:
                    cuts.append(int(out[-1]))
                    continue
                if lo < hi - depth <= hi:
                    cuts.append(int(hi - depth))
                    continue
            cand = np.arange(lo + 1, hi + 1)
            cuts.append(int(cand[np.argmax(gap_before[cand])]))
        cuts = np.asarray(cuts, dtype=np.int64)
        if _alike_pieces(kern, rows, cuts, keys.size):
            return cuts, at_sync
    return None


def _alike_pieces(kern: np.ndarray, rows: np.ndarray, cuts: np.ndarray, n: int) -> bool:
    """Whether the cuts give pieces that hold the same kernels (each alike the largest)."""
    bounds = np.concatenate(([0], cuts, [n]))
    pieces = [kern[np.searchsorted(rows, a):np.searchsorted(rows, b)] for a, b in zip(bounds[:-1], bounds[1:])]
    ref = max(pieces, key=len)
    ref_names, ref_counts = np.unique(ref, return_counts=True)
    return all(piece.size >= MIN_STEP_KERNELS and _alike(piece, ref_names, ref_counts) >= REPEAT_ALIKE
               for piece in pieces)


def _alike(piece: np.ndarray, ref_names: np.ndarray, ref_counts: np.ndarray) -> float:
    """Weighted Jaccard similarity of a piece's kernel-name counts with the reference's."""
    names, counts = np.unique(piece, return_counts=True)
    every = np.union1d(names, ref_names)
    a = np.zeros(every.size)
    b = np.zeros(every.size)
    a[np.searchsorted(every, names)] = counts
    b[np.searchsorted(every, ref_names)] = ref_counts
    return float(np.minimum(a, b).sum() / max(np.maximum(a, b).sum(), 1))


def _activity_keys(acts: pl.DataFrame) -> np.ndarray:
    return acts.select(
        pl.when(pl.col("is_kernel")).then(pl.col("demangled_id"))
        .when(pl.col("memop") == "memcpy").then(-1).otherwise(-2)
    ).to_series().to_numpy()


DEVICE_TO_HOST = 2  # nsys's copyKind of a device-to-host copy


def _to_host(acts: pl.DataFrame) -> np.ndarray:
    """Positions (in the frame's order) of the device-to-host copies."""
    if "copy_kind" not in acts.columns:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((acts["copy_kind"] == DEVICE_TO_HOST).fill_null(False).to_numpy())


def _gap_before(acts: pl.DataFrame) -> np.ndarray:
    """Idle time before each activity (in the frame's order): its start less the latest end
    of the activities before it, 0 when it overlaps them."""
    start = acts["start"].to_numpy()
    prev_end = np.maximum.accumulate(acts["end"].to_numpy())
    gap = np.zeros(len(start))
    gap[1:] = np.maximum(start[1:] - prev_end[:-1], 0)
    return gap


def split_capture_windows(windows: pl.DataFrame, acts: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame | None:
    """The windows with each capture range that repeats a whole step split into one window
    per step (None when no capture range does). A step's window ends at the host
    synchronization that closes it (the sampled token's copy to the host), or just before the
    first launch of the next step when the cut is at an idle gap instead."""
    caps = windows.filter(pl.col("delimiter") == "capture")
    if caps.is_empty():
        return None
    sync = api.select("pid", "start", "end", "is_sync").filter(pl.col("is_sync"))
    out, changed = [], False
    for w in windows.iter_rows(named=True):
        if w["delimiter"] != "capture":
            out.append(w)
            continue
        a = (acts.filter(pl.col("window") == w["window"])
             .select("device", "launch_start", "start", "end", "is_kernel", "demangled_id", "memop", "copy_kind")
             .sort("launch_start", "start"))
        if a.height == 0 or a["device"].n_unique() > 1:
            out.append(w)
            continue
        s = sync.filter((pl.col("pid") == w["pid"]) & (pl.col("start") >= w["w_start"])
                        & (pl.col("start") <= w["w_end"])).sort("start")
        launch = a["launch_start"].to_numpy()
        pos = np.searchsorted(launch, s["start"].to_numpy(), side="right")
        found = split_repeats(_activity_keys(a), a["is_kernel"].to_numpy(), _gap_before_in_order(a), pos,
                              _to_host(a))
        if found is None:
            out.append(w)
            continue
        cuts, at_sync = found
        ends = []
        sync_end, sync_pos = s["end"].to_numpy(), pos
        for c in cuts.tolist():
            mine = np.flatnonzero(sync_pos == c)
            ends.append(int(sync_end[mine[-1]]) if at_sync and mine.size else int(launch[c]) - 1)
        starts = [w["w_start"]] + [e + 1 for e in ends]
        ends = ends + [w["w_end"]]
        n = len(starts)
        how = "sync" if at_sync else "period"
        for i, (lo, hi) in enumerate(zip(starts, ends)):
            out.append({**w, "w_start": lo, "w_end": hi, "delimiter": how,
                        "name": f"{w['name']}, step {i + 1} of {n}"})
        changed = True
    if not changed:
        return None
    return (pl.DataFrame(out, schema=windows.schema).drop("window").sort("w_start")
            .with_row_index("window"))


def _gap_before_in_order(a: pl.DataFrame) -> np.ndarray:
    """_gap_before of activities given in launch order, computed in start order."""
    order = a.with_row_index("_i").sort("start")
    gap = _gap_before(order)
    out = np.zeros(a.height)
    out[order["_i"].to_numpy()] = gap
    return out


def _periodic_steps(acts: pl.DataFrame, sync: pl.DataFrame | None = None) -> tuple[list[tuple], list[tuple]]:
    """Split each (pid, device) activity sequence at its repeat period.

    Returns step rows (pid, device, delimiter, name) and (row, local step number) pairs.
    Boundaries sit at the phase of the period with the widest idle gap before it: the host
    work between two iterations. When that period is shorter than half the whole step the
    sequence repeats (a layer of an LLM step, not the step), the sequence is cut into its
    whole steps instead (split_repeats, at the host synchronizations in `sync`: pid, start).
    """
    steps, assign = [], []
    for (pid, device), grp in acts.sort("start").group_by(["pid", "device"], maintain_order=True):
        keys = _activity_keys(grp)
        rows = grp["row"].to_numpy()
        p = find_period(keys)
        whole = None
        if p is not None and sync is not None:
            mine = sync.filter(pl.col("pid") == pid)["start"].to_numpy()
            launch = grp["launch_start"].fill_null(-1).to_numpy()
            # calls launch in start order on one device stream: a sync's position is the first
            # activity whose launch follows it
            pos = np.searchsorted(np.maximum.accumulate(launch), mine, side="right")
            whole = split_repeats(keys, grp["is_kernel"].to_numpy(), _gap_before(grp), pos, _to_host(grp))
            if whole is not None and 2 * p > len(keys) / (len(whole[0]) + 1):
                whole = None
        if whole is not None:
            cuts, at_sync = whole
            bounds = np.concatenate(([0], cuts, [len(keys)]))
            first = len(steps)
            how = "sync" if at_sync else "period"
            for i in range(len(bounds) - 1):
                steps.append((pid, device, how, f"whole step {i + 1} of {len(bounds) - 1}"))
            local = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
            assign.append((rows, first + local))
            continue
        if p is None:
            steps.append((pid, device, "trace", "whole trace"))
            assign.append((rows, np.full(len(rows), len(steps) - 1)))
            continue
        start = grp["start"].to_numpy()
        prev_end = np.maximum.accumulate(grp["end"].to_numpy())
        gap = np.zeros(len(start))
        gap[1:] = np.maximum(start[1:] - prev_end[:-1], 0)
        n = len(keys)
        phase_score = np.bincount(np.arange(n) % p, weights=gap, minlength=p) / np.bincount(
            np.arange(n) % p, minlength=p
        )
        phase = int(np.argmax(phase_score))
        bounds = list(range(phase, n, p))
        if n - bounds[-1] < p:  # incomplete tail
            bounds_end = bounds[-1]
            bounds = bounds[:-1]
        else:
            bounds_end = n
        if not bounds:
            steps.append((pid, device, "trace", "whole trace"))
            assign.append((rows, np.full(len(rows), len(steps) - 1)))
            continue
        first = len(steps)
        for i, b in enumerate(bounds):
            steps.append((pid, device, "period", f"period {p} #{i}"))
        local = (np.arange(bounds[0], bounds_end) - bounds[0]) // p
        assign.append((rows[bounds[0]:bounds_end], first + local))
    return steps, assign


# vLLM names the threads of its engine processes (`VLLM::EngineCore`, `VLLM::Worker_TP0`, ...);
# nsys keeps 15 characters of a thread's name
VLLM_THREAD_PREFIX = "VLLM::"


def vllm_engine_pids(trace) -> set[int]:
    """The processes with GPU work that are vLLM engine processes (a thread named VLLM::…).
    nsys lists the threads of every process it saw on the host, other sessions' included: only
    those with kernels or memops of this trace count."""
    threads = trace.threads
    if threads.is_empty():
        return set()
    named = set(threads.filter(pl.col("name").str.starts_with(VLLM_THREAD_PREFIX))["pid"].unique().to_list())
    if not named:
        return set()
    gpu = set(trace.kernels["pid"].unique().to_list()) | set(trace.memops["pid"].unique().to_list())
    return named & gpu


def engine_pids_without_steps(vllm: set[int], windows: pl.DataFrame) -> set[int]:
    """The vLLM engine processes none of whose work is an engine step: no step range, no
    scheduler range, no capture range and no iteration of the engine loop after the start-up
    (a trace that holds the engine's start-up only). They get no step: neither the repeat
    period of their start-up's kernels (thousands of two-kernel "steps") nor the whole process
    as one step is an engine step (analysis/capture_check.py says why there is none). `vllm`:
    vllm_engine_pids(trace)."""
    return vllm - set(windows["pid"].unique().to_list())


def find_windows(trace, api: pl.DataFrame, step_regex: str | None = None,
                 vllm: set[int] | None = None) -> pl.DataFrame:
    """The host windows of the steps of every process that has delimiters (nvtx, then capture,
    then graph, the first kind found per process), indexed by `window` in start order. A vLLM
    engine process is delimited by vLLM's ranges, a capture range or its engine loop only: a
    graph replay of vLLM is a piece of a step (piecewise graphs) or one of its start-up's runs."""
    step_regex = step_regex or None  # "" means the default, as before
    pids_all = set(trace.kernels["pid"].unique().to_list()) | set(trace.memops["pid"].unique().to_list())
    vllm = vllm_engine_pids(trace) if vllm is None else vllm  # the caller's, when it has them
    windows = []
    covered: set[int] = set()
    for make in (
        lambda: _windows_nvtx(trace.nvtx, step_regex),
        lambda: _windows_schedule(trace.nvtx, api),
        # a window of a long run: the engine loop's steps the whole run has (by_windows.py)
        lambda: (trace.engine_windows if trace.engine_windows is not None
                 else engine_windows(trace, api, pids_all - covered)),
        lambda: _windows_capture(api),
        lambda: _windows_graph(api).filter(~pl.col("pid").is_in(list(vllm))),
    ):
        if pids_all <= covered:
            break  # every process has its steps: the later kinds would only be filtered away
        w = make()
        w = w.filter(~pl.col("pid").is_in(list(covered)) & pl.col("pid").is_in(list(pids_all)))
        if w.height:
            windows.append(w)
            covered |= set(w["pid"].unique().to_list())
    # relaxed: NVTX windows carry the model's Int32 ids, capture and graph windows Int64; a TP
    # trace whose ranks are delimited differently (one rank's step ranges lost) mixes them
    windows = pl.concat(windows, how="vertical_relaxed") if windows else _no_windows()
    if windows.height and (windows["w_end"] == OPEN_END).any():
        windows = _close_open_windows(trace, api, windows)
    windows = _trim_idle_tails(api, windows)
    return windows.sort("w_start").with_row_index("window")


# the delimiters whose window runs to the next iteration's start rather than to a range's end
TO_THE_NEXT = ("engine", "schedule")


def _trim_idle_tails(api: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """An engine or scheduler window runs to the next iteration's start. When the engine sat idle
    before that (a pause of COMPILE_PAUSE_NS or more between two CUDA calls of its process, after
    which the window holds no launch or copy: a server with no request to serve), the step ends
    with the end of its last call before the pause, and the pause (with the few queries after it)
    lies between steps, in none. A pause with launches after it is the step's own (a compilation)."""
    if windows.is_empty() or not windows["delimiter"].is_in(TO_THE_NEXT).any() or api.is_empty():
        return windows
    ends = windows["w_end"].to_numpy().copy()
    begins = windows["w_start"].to_numpy()
    changed = False
    pids = windows["pid"].cast(pl.Int64).to_numpy()
    delim = windows["delimiter"].is_in(TO_THE_NEXT).to_numpy()
    for pid in np.unique(pids[delim]).tolist():
        mine = api.filter(pl.col("pid") == pid).sort("start")
        if mine.height == 0:
            continue
        st, en = mine["start"].to_numpy(), mine["end"].to_numpy()
        work = (mine["is_launch"] | mine["is_copy"]).to_numpy()
        for i in np.flatnonzero(delim & (pids == pid)).tolist():
            lo, hi = np.searchsorted(st, begins[i], "left"), np.searchsorted(st, ends[i], "right")
            if hi - lo < 1:
                continue
            s_, e_ = st[lo:hi], np.maximum.accumulate(en[lo:hi])
            # the pause before each call, and the one after the last call to the window's end
            pause = np.concatenate(([0], s_[1:] - e_[:-1], [ends[i] - e_[-1]]))
            w = work[lo:hi]
            last_work = int(np.flatnonzero(w)[-1]) if w.any() else -1
            tail = np.flatnonzero(pause[last_work + 1:] >= COMPILE_PAUSE_NS) + last_work + 1
            if tail.size and tail[0] > 0:
                ends[i] = int(e_[tail[0] - 1])  # the end of the last call before the first idle pause
                changed = True
    if not changed:
        return windows
    return windows.with_columns(pl.Series("w_end", ends, dtype=windows.schema["w_end"]))


def _close_open_windows(trace, api: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """An open capture range ends at the process's last GPU activity or launching call."""
    acts = pl.concat([trace.kernels.lazy().select("pid", "corr", "end"), trace.memops.lazy().select("pid", "corr", "end")])
    last_act = acts.group_by("pid").agg(pl.col("end").max().alias("_act")).collect()
    # only a call that ends after its process's last activity can be the last: those few are
    # matched to the activities they launched (a semi join of every call cost a hash table of
    # every kernel)
    late = (api.lazy().select("pid", "corr", "end").join(last_act.lazy(), on="pid", how="inner")
            .filter(pl.col("end") > pl.col("_act")).select("pid", "corr", "end").collect())
    if late.height:  # the activities of those calls (the small side is the one hashed), then the calls
        keys = late.select("pid", "corr").unique()
        hit = acts.select("pid", "corr").join(keys.lazy(), on=["pid", "corr"], how="semi").unique().collect()
        late = late.join(hit, on=["pid", "corr"], how="semi")
    last = pl.concat([last_act.select("pid", pl.col("_act").alias("end")), late.select("pid", "end")]).group_by(
        "pid").agg(pl.col("end").max().alias("_last"))
    return windows.join(last, on="pid", how="left").with_columns(
        pl.when(pl.col("w_end") == OPEN_END).then(pl.col("_last")).otherwise(pl.col("w_end")).alias("w_end")
    ).drop("_last")


class NoStep(InputError):
    """No step in the whole trace (the CLI's one line, exit 2)."""


def segment(trace, acts: pl.DataFrame, windows: pl.DataFrame, sync: pl.DataFrame | None = None,
            without_steps: set[int] | frozenset = frozenset()) -> Segmentation:
    """Steps and each activity's step. `acts` carry the window their launching call started in
    (activities() over an api with window_of()); processes without windows are split by period
    (into whole steps at the host synchronizations `sync` (pid, start) when the period is a
    layer's), but for those in `without_steps` (engine_pids_without_steps), whose activities
    are in no step."""
    warnings: list[str] = []
    covered = set(windows["pid"].unique().to_list()) | set(without_steps)
    step_rows: list[tuple] = []
    assigned = []
    window_steps = None
    by_window = None  # the step as an expression of the window, when that decides it
    if windows.height:
        # a step is (window, device); number them by window start, then device
        hit = acts.lazy().filter(pl.col("window").is_not_null()).select("row", "device", "window")
        keys = group_by_packed(hit.select("window", "device").collect(), ["window", "device"]).join(
            windows.select("window", "w_start"), on="window").sort("w_start", "device").with_row_index("step")
        if keys["window"].n_unique() == keys.height:  # one device per window: a lookup by window
            by_window = lookup("window", keys["window"], keys["step"].cast(pl.Int64)).alias("step")
            step_of = hit.select("row", by_window)
        else:
            step_of = hit.join(keys.lazy().select("window", "device", pl.col("step").cast(pl.Int64)),
                               on=["window", "device"], how="left", maintain_order="left").select("row", "step")
        assigned.append(step_of)  # a lazy frame: collected only when rows are assigned one by one
        window_steps = keys.select("window", pl.col("step").cast(pl.Int64))
        steps_w = keys.join(windows.drop("w_start"), on="window").select(
            pl.col("step").cast(pl.Int64), "pid", "device", "delimiter", "name", "tid", "w_start", "w_end")
        step_rows_frame = steps_w
        empty_windows = windows.height - keys["window"].n_unique()
        if empty_windows:
            warnings.append(note(EMPTY_STEP_RANGES, count=empty_windows))
    else:
        step_rows_frame = pl.DataFrame(schema=dict(zip(STEP_COLS, (
            pl.Int64, pl.Int64, pl.Int64, pl.String, pl.String, pl.Int64, pl.Int64, pl.Int64))))

    rest = acts.filter(~pl.col("pid").is_in(list(covered)))
    if rest.height:
        per_rows, per_assign = _periodic_steps(rest, sync)
        base = step_rows_frame.height
        if per_rows:
            step_rows = [(base + i, pid, dev, delim, name, None, None, None)
                         for i, (pid, dev, delim, name) in enumerate(per_rows)]
            step_rows_frame = pl.concat([step_rows_frame, pl.DataFrame(
                step_rows, schema=step_rows_frame.schema, orient="row")])
            rows = np.concatenate([r for r, _ in per_assign])
            local = np.concatenate([s for _, s in per_assign])
            assigned.append(pl.DataFrame({"row": rows.astype(np.uint32), "step": (local + base).astype(np.int64)}))
        whole = [name for _, _, delim, name in per_rows if delim == "trace"]
        if whole:
            warnings.append(note(ONE_STEP_STREAMS, count=len(whole)))
    if step_rows_frame.is_empty():
        raise NoStep(
            f"{trace.path}: no step found (no kernels with a launching call inside a step range); "
            "check --step-regex or capture with an NVTX range per step"
        )
    if by_window is not None and not rest.height:
        # every activity's step follows from its window alone: one lookup, no per-row
        # assignment frame and scatter (tens of MB of transient frames per million activities)
        return Segmentation(step_rows_frame, acts.with_columns(by_window), warnings, window_steps)
    a = pl.concat([f.collect() if isinstance(f, pl.LazyFrame) else f for f in assigned])
    # rows are 0..n-1 in acts' order: scatter the step ids instead of joining on row
    step = np.full(acts.height, -1, dtype=np.int64)
    step[a["row"].to_numpy()] = a["step"].to_numpy()
    acts = acts.with_columns(pl.Series("step", step).replace(-1, None))
    return Segmentation(step_rows_frame, acts, warnings, window_steps)


_VLLM = ours(r"execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)[^)]*\)")
# (?<!\w): a key starts a word. Without it every position inside a long word without "="
# was tried again, each scanning to the word's end: quadratic (a 1 MB step name hung the run);
# the matches are the same, since a key that starts inside a word starts at its first letter
_KV = ours(r"(?<!\w)(\w+)=([\w.\-/]+)")
VLLM_STEP_RE = _VLLM  # vLLM's step range names


PHASES = ("prefill", "decode", "mixed")


def composed_phase(prompt_reqs: int, decode_reqs: int) -> str:
    """A step's phase from its composition (DEFINITIONS.md, "Serving runs"): prompt work and
    decodes in one step is `mixed` (chunked prefill beside continuous batching)."""
    if prompt_reqs and decode_reqs:
        return "mixed"
    return "prefill" if prompt_reqs else "decode"


def step_shape(name: str | None) -> dict:
    """Phase, batch, tokens, ... recorded in a step's NVTX name (stepscope's or vLLM's)."""
    if not name:
        return {}
    m = _VLLM.search(name)
    if m:
        n_ctx, t_ctx, n_gen, t_gen = map(int, m.groups())
        return {"phase": composed_phase(n_ctx, n_gen), "batch": n_ctx + n_gen,
                "tokens": t_ctx + t_gen, "prompt_reqs": n_ctx, "prompt_tokens": t_ctx,
                "decode_reqs": n_gen, "decode_tokens": t_gen}
    shape: dict = {}
    for k, v in _KV.findall(name):
        shape[k] = int(v) if v.isdigit() else v
    if shape.get("phase") not in PHASES:
        shape.pop("phase", None)
    return shape


def budget_shape(fig: dict, sidecar: dict | None, given: dict | None = None) -> tuple[dict, list[str]]:
    """Model, phase, batch and context of a step for its byte budget, and the ones still lacking:
    what was given (`--model` etc.), else the step's name, else what `stepscope trace` recorded
    beside the export (vLLM's step names carry neither the model nor the context), and for the
    phase the one the inventory read. `budget` and `report --cells` both ask here."""
    shape = {**((sidecar or {}).get("shape") or {}), **step_shape(fig.get("name"))}
    given = {k: v for k, v in (given or {}).items() if v}
    out = {k: given.get(k) or shape.get(k) for k in ("model", "phase", "batch", "context")}
    out["phase"] = out["phase"] or fig.get("phase")
    out["tp"] = shape.get("tp") if isinstance(shape.get("tp"), int) else 1
    return out, [k for k in ("model", "phase", "batch", "context") if not out[k]]
