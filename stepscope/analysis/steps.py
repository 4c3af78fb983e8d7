"""Step segmentation: which activities (kernels and memops) belong to which engine step.

Delimiters, in order of preference, chosen per process (DEFINITIONS.md, "A step and its kernels"):
  nvtx     an NVTX range whose name matches the step regex, on the launching thread
  capture  a cudaProfilerStart → cudaProfilerStop capture range
  graph    one cudaGraphLaunch replay (to the next replay on the same thread)
  period   the repeat period of the kernel sequence, for traces without markers
  trace    no structure found: the whole process/device is one step (with a warning)
A kernel belongs to a step when its launching call (same process, same correlationId) starts
inside the step's host window. Steps are per process and per device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from stepscope import apinames
from stepscope.analysis.frames import sorted_by
from stepscope.errors import InputError

DEFAULT_STEP_REGEX = r"^(execute_context_\d+\(\d+\)_generation_\d+\(\d+\)|step(\s.*)?|ProfilerStep#\d+)$"

STEP_COLS = ("step", "pid", "device", "delimiter", "name", "tid", "w_start", "w_end")


def api_flags(api: pl.DataFrame, strings: dict[int, str]) -> pl.DataFrame:
    """API calls with their decoded name and launch / sync / graph / profiler flags."""
    ids = api["name_id"].unique().drop_nulls().to_list()
    names = {i: strings.get(i, "") for i in ids}
    vals = list(names.values())
    keys = pl.Series(list(names), dtype=pl.Int64)

    def flag(values: list[bool], alias: str) -> pl.Expr:
        return pl.col("name_id").replace_strict(keys, pl.Series(values, dtype=pl.Boolean), default=False,
                                                return_dtype=pl.Boolean).alias(alias)

    return api.with_columns(
        pl.col("name_id").replace_strict(keys, pl.Series(vals, dtype=pl.String), default=None,
                                         return_dtype=pl.String).cast(pl.Categorical).alias("api_name"),
        flag([n.startswith(apinames.LAUNCH) for n in vals], "is_launch"),
        flag([n.startswith(apinames.GRAPH_LAUNCH) for n in vals], "is_graph_launch"),
        flag([n.startswith(apinames.SYNC) or bool(apinames.BLOCKING_COPY.match(n)) for n in vals], "is_sync"),
        flag([n.startswith(apinames.PROFILER_START) for n in vals], "is_prof_start"),
        flag([n.startswith(apinames.PROFILER_STOP) for n in vals], "is_prof_stop"),
    )


def activities(kernels: pl.DataFrame, memops: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """Kernels and memops in one frame, each joined to its launching call on (pid, corr)."""
    k = kernels.with_columns(pl.lit(True).alias("is_kernel"), pl.lit(None, pl.String).alias("memop"),
                             pl.lit(None, pl.Int64).alias("bytes"))
    m = memops.rename({"kind": "memop"}).with_columns(pl.lit(False).alias("is_kernel"))
    acts = pl.concat([k, m], how="diagonal_relaxed") if m.height else k
    # correlationId is unique only within a process: join on (pid, corr), packed into one
    # integer key (pid < 2^24, so the key is exact while corr < 2^39), which hashes faster.
    key = (pl.col("pid") * (1 << 39) + pl.col("corr")).alias("_key")
    calls = api.select(key, "tid", pl.col("start").alias("launch_start"),
                       pl.col("end").alias("launch_end"), pl.col("name_id").alias("launch_name_id"))
    if calls["_key"].n_unique() != calls.height:  # keep one call per (pid, corr)
        calls = calls.unique("_key", keep="first", maintain_order=True)
    acts = acts.with_columns(key).join(calls, on="_key", how="left").drop("_key")
    return acts.with_row_index("row")


@dataclass
class Segmentation:
    steps: pl.DataFrame  # STEP_COLS
    acts: pl.DataFrame  # activities with a `step` column (null = outside every step)
    warnings: list[str]


def _windows_nvtx(nvtx: pl.DataFrame, step_regex: str) -> pl.DataFrame:
    try:
        re.compile(step_regex)
    except re.error as e:
        raise InputError(f"bad --step-regex {step_regex!r}: {e}") from None
    if nvtx.is_empty():
        return _no_windows()
    names = nvtx.select("name").unique().drop_nulls()
    pat = re.compile(step_regex)
    keep = names.filter(pl.Series([bool(pat.search(n)) for n in names["name"].to_list()], dtype=pl.Boolean))
    w = nvtx.join(keep, on="name", how="semi").sort("pid", "tid", "start")
    # Nested step ranges (torch.profiler's ProfilerStep#N around a named `step ...` range):
    # the innermost one is the step; a range that holds the next one on its thread is dropped.
    holds_next = (pl.col("end").shift(-1).over("pid", "tid") <= pl.col("end")) & (
        pl.col("start").shift(-1).over("pid", "tid") >= pl.col("start"))
    w = w.filter(~holds_next.fill_null(False))
    return w.select("pid", "tid", pl.col("start").alias("w_start"), pl.col("end").alias("w_end"),
                    "name", pl.lit("nvtx").alias("delimiter"))


def _windows_capture(api: pl.DataFrame) -> pl.DataFrame:
    marks = api.filter(pl.col("is_prof_start") | pl.col("is_prof_stop")).sort("start")
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
    return pl.DataFrame(rows, schema=_WINDOW_SCHEMA, orient="row") if rows else _no_windows()


def _windows_graph(api: pl.DataFrame) -> pl.DataFrame:
    g = api.filter(pl.col("is_graph_launch")).sort("pid", "tid", "start")
    if g.is_empty():
        return _no_windows()
    nxt = pl.col("start").shift(-1).over("pid", "tid")
    return g.select(
        "pid", "tid", pl.col("start").alias("w_start"),
        # a replay's window runs to the next replay on the thread (the last one: to its own end,
        # widened later to cover what it launched)
        (pl.coalesce(nxt - 1, pl.col("end"))).alias("w_end"),
        pl.col("api_name").alias("name"), pl.lit("graph").alias("delimiter"),
    )


OPEN_END = (1 << 62)  # the end of a capture range whose stop call was not recorded
_WINDOW_SCHEMA = {"pid": pl.Int64, "tid": pl.Int64, "w_start": pl.Int64, "w_end": pl.Int64,
                  "name": pl.String, "delimiter": pl.String}


def _no_windows() -> pl.DataFrame:
    return pl.DataFrame(schema=_WINDOW_SCHEMA)


def in_windows(points: pl.DataFrame, at: str, windows: pl.DataFrame, window_col: str) -> pl.DataFrame:
    """The points (pid, tid and a time column `at`) that fall inside a host window, with the
    window's `window_col`. A window with a tid holds that thread's points; one without (a
    capture range) any thread's of its process. Windows of one key do not overlap."""
    out = []
    points = sorted_by(points, at)
    for by, w in (
        (["pid", "tid"], windows.filter(pl.col("tid").is_not_null())),
        (["pid"], windows.filter(pl.col("tid").is_null())),
    ):
        if w.is_empty():
            continue
        hit = points.join_asof(
            w.select(*by, "w_start", "w_end", window_col).sort("w_start"), left_on=at, right_on="w_start",
            by=by, strategy="backward", check_sortedness=False,
        ).filter(pl.col(at) <= pl.col("w_end"))
        out.append(hit.select(*points.columns, window_col))
    if not out:
        return points.clear().with_columns(pl.lit(None, windows.schema[window_col]).alias(window_col))
    return pl.concat(out)


def _assign_windows(acts: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """(row, device, window) for activities whose launching call starts inside a window."""
    launched = acts.filter(pl.col("launch_start").is_not_null()).select(
        "row", "device", "pid", "tid", "launch_start")
    return in_windows(launched, "launch_start", windows, "window").select("row", "device", "window")


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


def _periodic_steps(acts: pl.DataFrame) -> tuple[list[tuple], list[tuple]]:
    """Split each (pid, device) activity sequence at its repeat period.

    Returns step rows (pid, device, delimiter, name) and (row, local step number) pairs.
    Boundaries sit at the phase of the period with the widest idle gap before it: the host
    work between two iterations.
    """
    steps, assign = [], []
    for (pid, device), grp in acts.sort("start").group_by(["pid", "device"], maintain_order=True):
        keys = grp.select(
            pl.when(pl.col("is_kernel")).then(pl.col("demangled_id"))
            .when(pl.col("memop") == "memcpy").then(-1).otherwise(-2)
        ).to_series().to_numpy()
        rows = grp["row"].to_numpy()
        p = find_period(keys)
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


def segment(trace, acts: pl.DataFrame, api: pl.DataFrame, step_regex: str | None = None) -> Segmentation:
    warnings: list[str] = []
    step_regex = step_regex or DEFAULT_STEP_REGEX
    pids_all = set(acts["pid"].unique().to_list())
    windows = []
    covered: set[int] = set()
    for make in (
        lambda: _windows_nvtx(trace.nvtx, step_regex),
        lambda: _windows_capture(api),
        lambda: _windows_graph(api),
    ):
        w = make()
        w = w.filter(~pl.col("pid").is_in(list(covered)) & pl.col("pid").is_in(list(pids_all)))
        if w.height:
            windows.append(w)
            covered |= set(w["pid"].unique().to_list())
    windows = pl.concat(windows) if windows else _no_windows()
    if windows.height and (windows["w_end"] == OPEN_END).any():
        last = acts.group_by("pid").agg(
            pl.max_horizontal(pl.col("end").max(), pl.col("launch_end").max()).alias("_last"))
        windows = windows.join(last, on="pid", how="left").with_columns(
            pl.when(pl.col("w_end") == OPEN_END).then(pl.col("_last")).otherwise(pl.col("w_end")).alias("w_end")
        ).drop("_last")

    step_rows: list[tuple] = []
    assigned = []
    if windows.height:
        windows = windows.sort("w_start").with_row_index("window")
        hit = _assign_windows(acts, windows)
        # a step is (window, device); number them by window start, then device
        wd = (pl.col("window").cast(pl.Int64) * (1 << 20) + pl.col("device")).alias("_wd")
        keys = hit.select(wd, "window", "device").unique("_wd").join(
            windows.select("window", "w_start"), on="window").sort("w_start", "device").with_row_index("step")
        step_of = hit.with_columns(wd).select(
            "row", pl.col("_wd").replace_strict(keys["_wd"], keys["step"].cast(pl.Int64), return_dtype=pl.Int64)
            .alias("step"))
        assigned.append(step_of)
        steps_w = keys.join(windows.drop("w_start"), on="window").select(
            pl.col("step").cast(pl.Int64), "pid", "device", "delimiter", "name", "tid", "w_start", "w_end")
        step_rows_frame = steps_w
        empty_windows = windows.height - keys["window"].n_unique()
        if empty_windows:
            warnings.append(f"{empty_windows} step range(s) launched no GPU work and were skipped")
    else:
        step_rows_frame = pl.DataFrame(schema=dict(zip(STEP_COLS, (
            pl.Int64, pl.Int64, pl.Int64, pl.String, pl.String, pl.Int64, pl.Int64, pl.Int64))))

    rest = acts.filter(~pl.col("pid").is_in(list(covered)))
    if rest.height:
        per_rows, per_assign = _periodic_steps(rest)
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
            warnings.append(
                f"{len(whole)} process/device stream(s) had no step markers and no repeating kernel "
                "sequence: each is analyzed as one step (add an NVTX range per step, or --step-regex)"
            )
    if step_rows_frame.is_empty():
        raise InputError(
            f"{trace.path}: no step found (no kernels with a launching call inside a step range); "
            "check --step-regex or capture with an NVTX range per step"
        )
    a = pl.concat(assigned)
    # rows are 0..n-1 in acts' order: scatter the step ids instead of joining on row
    step = np.full(acts.height, -1, dtype=np.int64)
    step[a["row"].to_numpy()] = a["step"].to_numpy()
    acts = acts.with_columns(pl.Series("step", step).replace(-1, None))
    return Segmentation(step_rows_frame, acts, warnings)


_VLLM = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_KV = re.compile(r"(\w+)=([\w.\-/]+)")


def step_shape(name: str | None) -> dict:
    """Phase, batch, tokens, ... recorded in a step's NVTX name (stepscope's or vLLM's)."""
    if not name:
        return {}
    m = _VLLM.search(name)
    if m:
        n_ctx, t_ctx, n_gen, t_gen = map(int, m.groups())
        return {"phase": "prefill" if n_ctx else "decode", "batch": n_ctx + n_gen,
                "tokens": t_ctx + t_gen}
    shape: dict = {}
    for k, v in _KV.findall(name):
        shape[k] = int(v) if v.isdigit() else v
    if shape.get("phase") not in ("prefill", "decode"):
        shape.pop("phase", None)
    return shape
