"""When and how `analyze` reads a long trace by windows of steps (analysis/windows.py): the
export's size decides, the reader gives each window's events, and a progress bar counts them.

A trace of more than WINDOW_MIN_KERNELS kernels whose steps are NVTX step ranges or vLLM's engine
iterations (its `schedule: …` ranges, or without any range its engine loop's, found once from a
light read of the run) is analyzed WINDOW_KERNELS kernels at a time (about; by its steps' mean
size), so that memory holds one window's events, not the run's: docs/PERFORMANCE.md,
"A long run in bounded memory". Any other trace, and any trace `plan` or a window finds unfit
(analysis/windows.WholeTrace), is analyzed whole, as before.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from stepscope.errors import InputError

# below this many kernels the whole trace is read at once (its frames, a few hundred MB at most)
WINDOW_MIN_KERNELS = 2_000_000
# the kernels a window holds, about: ~0.3 GB while it is analyzed
WINDOW_KERNELS = 500_000


def window_steps_for(n_kernels: int, n_ranges: int, given: int | None) -> int:
    """How many step ranges a window owns: `given` (the user's --window-steps; 0: none), else
    WINDOW_KERNELS worth of steps, for a trace of more than WINDOW_MIN_KERNELS kernels."""
    if given is not None:
        return given
    env = _env_window_steps()
    if env is not None:
        return env
    if n_kernels <= WINDOW_MIN_KERNELS or not n_ranges:
        return 0
    per_step = max(1, n_kernels // n_ranges)
    return max(1, WINDOW_KERNELS // per_step)


def _env_window_steps() -> int | None:
    """STEPSCOPE_WINDOW_STEPS, the tests' and benchmarks' setting, where it is a count (anything
    else is no setting)."""
    env = os.environ.get("STEPSCOPE_WINDOW_STEPS", "").strip()
    return int(env) if env.isdigit() else None


def diagnosis(path: Path, step_regex, rules, calibration, window_steps: int | None = None, *,
              scheduler: str | None = None, workers: int | None = None, cache: bool = True, strict: bool = False,
              code: str = ""):
    """The Diagnosis of the nsys SQLite export `path` analyzed by windows, or None when it is
    analyzed whole (not an nsys SQLite export, too small, or its steps unfit for windows).
    `scheduler` (a dask scheduler's address) or `workers` (a local dask cluster's size): the
    windows are analyzed there, each on one worker, and merged here (the same Diagnosis).
    `cache`: the merged analysis is kept in the export's cache folder (ingest/cache.py's
    frameless entry) and read from there on the next run: a warm run reads a few per-step frames;
    `code`: what of the code decides it (library.py's formats, the bundled rules: part of its key)."""
    from stepscope.analysis import windows
    from stepscope.analysis.classify import load_rules
    from stepscope.ingest.nsys_sqlite import is_sqlite
    from stepscope.render import progress

    import polars as pl

    from stepscope.analysis.diagnosis import diagnose

    if window_steps == 0:
        return None
    pool = None
    try:
        if not path.is_file() or not is_sqlite(path):
            return None
        if window_steps is None and _env_window_steps() is None and _kernel_rows(path) <= WINDOW_MIN_KERNELS:
            return None  # the usual trace: read whole, never opened twice
        key = _kept_key(path, step_regex, rules, strict, code) if cache and code else None
        kept = _kept(path, key) if key is not None else None
        if kept is not None:
            progress.stage(f"reading the kept analysis of {path.name}")
            return diagnose(kept[0], calibration, known=kept[1])
        # every read of the export on one thread of its own, the source opened there too (an
        # SQLite connection serves the thread that opened it): the next window is read while
        # this one is analyzed (the reading waits on SQLite, the analysis on polars)
        pool = ThreadPoolExecutor(1, thread_name_prefix="stepscope-windows")
        source = pool.submit(_source, path).result()
    except (OSError, InputError):  # the whole path's reading says what is wrong, in its own words
        if pool is not None:
            pool.shutdown()
        return None
    try:
        ranges = windows.step_ranges(source.base.nvtx, step_regex)  # none: no window (--strict's line is the whole's)
        engine = None
        if not ranges.height and not windows.step_ranges(source.base.nvtx, None).height:
            # no range at all (a plain capture without vLLM's scopes): the engine loop's steps,
            # found once from a light read of the run (its calls, a few marking kernels and copies)
            engine = pool.submit(source.engine_steps).result()
            if engine.select(pl.struct("pid", "w_start").is_duplicated().any()).item():
                # a preparation launched twice at one time (a capture's rows recorded twice): steps
                # of no host time between them, which a window's edge would split from their twin
                _read_whole(path, source.n_kernels, windows.SHARED_START, advice=False)
                return None
            ranges = windows.engine_ranges(engine)
        if not ranges.height:
            _read_whole(path, source.n_kernels, windows.NO_RANGES)
            return None
        n = window_steps_for(source.n_kernels, ranges.height, window_steps)
        if n <= 0:
            return None
        p = windows.plan(source.base.nvtx, step_regex, n, ranges, engine)
        if not p.windows:
            return None
        if scheduler is not None or workers:
            from stepscope import distribute

            jobs = [WindowJob(str(path), w, len(p.windows)) for w in p.windows]
            got = distribute.map_windows(jobs, window_job, step_regex, None if rules is None else str(rules),
                                         scheduler=scheduler, workers=workers, shared=source.state())
            results = [r for r, _ in got]
            for _, account in got:
                source.add_account(account)
        else:
            total = len(p.windows)
            rules_set = load_rules(rules)
            label = f"windows of {path.name} analyzed ({n:,} ranges each)"
            results = []

            def read(w, count):  # a window read again, wider: on the reading thread
                return pool.submit(source.read, w, count).result()

            ahead = pool.submit(source.read, p.windows[0])
            for i, w in enumerate(p.windows):
                progress.bar(label, i, total)
                sub = ahead.result()
                if i + 1 < total:  # one window read ahead, no more: memory holds two at most
                    ahead = pool.submit(source.read, p.windows[i + 1])
                results.append(windows.analyze_read(read, w, step_regex, rules_set, sub))
                del sub
            progress.bar(label, total, total)
        inv, known = windows.combined(pool.submit(source.trace_with_warnings).result(), results)
        del results
        if cache:
            _keep(path, key, inv, known)
        return diagnose(inv, calibration, known=known)
    except windows.WholeTrace as e:
        _read_whole(path, source.n_kernels, str(e), advice=False)
        return None
    finally:
        pool.submit(source.close).result()
        pool.shutdown()


# what reading a long run whole costs, about (the serving runs of docs/PERFORMANCE.md: 250–370
# bytes of peak memory per kernel whole)
WHOLE_BYTES_PER_KERNEL = 300


def _read_whole(path: Path, n_kernels: int, why: str, advice: bool = True) -> None:
    """One line on stderr where a long run (the windows were wanted) is read whole: why, about how
    much memory that takes, and (`advice`: it had no range to cut along) the capture that has them."""
    from stepscope.render import progress
    from stepscope.render.units import nbytes

    line = (f"{path.name}: its {n_kernels:,} kernels are read whole, in about "
            f"{nbytes(n_kernels * WHOLE_BYTES_PER_KERNEL)} of memory ({why})")
    if advice:
        line += ("; a long run is analyzed in bounded memory by windows of its step ranges: capture it with "
                 "VLLM_NVTX_SCOPES_FOR_PROFILING=1 (vLLM's scheduler ranges) or through vLLM's profiler "
                 "(its execute_context ranges)")
    progress.notice(line)


# --- the kept analysis -------------------------------------------------------------------------
# A long run analyzed by windows is kept whole, merged (its per-step frames: a few hundred MB at
# 25M kernels at most), in a frameless entry of the export's cache (ingest/cache.py): keyed by the
# export as it is now and by what decides the analysis (the formats of library.py, the rules,
# --step-regex, --strict, the code's version), not by the windows' size, which changes nothing.

WINDOWS_FORMAT = 1
_EVENTS = ("acts", "api", "launch_calls")  # held by no merged inventory
_SCALARS = ("format", "nsys_version", "schema_version", "graph_level_launches", "profiler_overhead_count",
            "profiler_overhead_ns")


def _kept_key(path: Path, step_regex, rules, strict: bool, code: str) -> str | None:
    import hashlib

    import polars as pl

    from stepscope import __version__

    try:
        user = "-" if rules is None else str(Path(rules).resolve()) + "|" + hashlib.sha256(
            Path(rules).read_bytes()).hexdigest()
    except OSError:
        return None
    raw = "|".join([str(WINDOWS_FORMAT), code, __version__, pl.__version__, repr(step_regex), user, str(bool(strict))])
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _kept(path: Path, key: str):
    """(Inventory, calibration-free frames) kept for `path` under `key`, or None."""
    import polars as pl

    from stepscope.analysis.inventory import FRAME_FIELDS, Inventory
    from stepscope.analysis.notes import from_data
    from stepscope.ingest import cache
    from stepscope.ingest.sidecar import read_sidecar
    from stepscope.model import Trace, empty, KERNEL_SCHEMA, MEMOP_SCHEMA, API_SCHEMA, NVTX_SCHEMA, STRING_SCHEMA

    if not cache.enabled():
        return None
    got = cache.load_derived(cache.frameless_entry(path, "windows"), "windows", key)
    if got is None:
        return None
    frames, extra = got
    t = extra["trace"]
    trace = Trace(path=path, kernels=empty(KERNEL_SCHEMA), memops=empty(MEMOP_SCHEMA), api=empty(API_SCHEMA),
                  nvtx=empty(NVTX_SCHEMA), strings=empty(STRING_SCHEMA), gpus=frames.pop("trace__gpus"),
                  **{k: t[k] for k in _SCALARS}, warnings=[])
    trace.sidecar, _ = read_sidecar(path)
    inv_frames = {f: frames.pop(f) if f not in _EVENTS else pl.DataFrame() for f in FRAME_FIELDS}
    known = {k[len("known__"):]: v for k, v in frames.items()}
    inv = Inventory(trace=trace, warnings=from_data(extra["warnings"]), **inv_frames)
    inv.kernels_total = extra["kernels_total"]
    return inv, known


def _keep(path: Path, key: str | None, inv, known: dict) -> None:
    from stepscope.analysis.inventory import FRAME_FIELDS
    from stepscope.analysis.notes import as_data
    from stepscope.ingest import cache

    if key is None or not cache.enabled():
        return
    entry = cache.frameless_entry(path, "windows")
    frames = {f: getattr(inv, f) for f in FRAME_FIELDS if f not in _EVENTS}
    frames |= {f"known__{k}": v for k, v in known.items()} | {"trace__gpus": inv.trace.gpus}
    t = inv.trace
    extra = {"warnings": as_data(inv.warnings), "kernels_total": inv.kernels_total,
             "trace": {k: getattr(t, k) for k in _SCALARS}}
    if cache.store_derived(entry, "windows", key, frames, extra) is not None:
        progress_notice = f"kept the analysis of {path.name} in {entry} (the next run reads it; --no-cache reads the export)"
        from stepscope.render import progress

        progress.notice(progress_notice)


@dataclass(frozen=True)
class WindowJob:
    """One window of a long report, as a dask task takes it: the export, the window, how many
    the report has."""

    path: str
    window: object
    of: int

    def __str__(self) -> str:  # how a failure names it (distribute.py)
        return f"{self.path} (window {self.window.index + 1} of {self.of})"


def window_job(job: WindowJob, step_regex=None, rules=None, cache=False, strict=False, shared=None):
    """A worker's task: the job's window read and analyzed, (WindowResult, the reading's account
    of values left out: the report's warnings add them up). `shared`: the reader as the report's
    process opened it (sent once to every worker), so that no worker opens the export again."""
    import polars as pl

    from stepscope.analysis import windows
    from stepscope.analysis.classify import load_rules

    # the worker's one reader (its connection open for the next task), with an account of this task's own
    reader = _Reader.from_state(Path(job.path), shared.for_another_read())
    r = windows.analyze_read(reader.read, job.window, step_regex, load_rules(rules))
    # every category as text between processes: a category is its process's (polars 1.33 read
    # another's codes as null or as other names); the kernels' names are categories again in the
    # report's process as it merges (windows.combined)
    def text(f):
        return f.with_columns(pl.col(pl.Categorical).cast(pl.String)) if isinstance(f, pl.DataFrame) else f

    r.inv = {k: text(v) for k, v in r.inv.items()}
    r.known = {k: text(v) for k, v in r.known.items()}
    return r, reader.account()


def _kernel_rows(path: Path) -> int:
    """The kernel table's last rowid (its rows, but for deleted ones): SQLite reads it off the
    table's B-tree without a scan. 0 when the export cannot say."""
    import sqlite3

    from stepscope.ingest.nsys_sqlite import connect_readonly

    try:
        con = connect_readonly(path)
        try:
            return int(con.execute("SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] or 0)
        finally:
            con.close()
    except (sqlite3.Error, InputError, OSError, TypeError, ValueError):
        return 0


class _Reader:
    """Windows read from the export itself (ingest/nsys_windows.py): one window's events at a time."""

    def __init__(self, path: Path):
        from stepscope.ingest.nsys_windows import WindowReader

        from stepscope.ingest.sidecar import read_sidecar

        self.reader = WindowReader(path)
        self.base = self.reader.base
        self.n_kernels = self.reader.n_kernels
        # what `stepscope trace` measured outside nsys, as ingest.read_trace reads it beside the export
        self.base.sidecar, self.sidecar_warning = read_sidecar(path)

    def read(self, w, count: bool = True):
        """Window `w`'s events; what the reading leaves out counted in its own span only (windows
        overlap by their context: each row counts once over the run), and not at all when `count`
        is False (the window read again, further: analysis/windows.analyze_read)."""
        trace = self.reader.read(w.lo, w.hi, w.own_lo, w.own_hi, count=count)
        # the grids a step's phase is told by where its name says none (an engine iteration's),
        # read from the rows the window's kernels lie among, as the whole analysis reads them
        span = self.reader.kernel_rowids
        if span is not None and any(d != "nvtx" for _, d in w.kinds):
            from stepscope.launch_config import NsysLaunchConfig

            trace.launch_config = NsysLaunchConfig(self.reader.path).within(*span)
        return trace

    def engine_steps(self):
        """The engine loop's steps of the whole run (analysis/windows.engine_plan), from a light
        read of it: the kernels of vLLM's input preparation and output and the device-to-host
        copies, then of its API calls those that decide the steps (analysis/engine_calls.py: two
        reads a chunk at a time, the second keeping the calls around each anchor), a warm-up
        run's kernels read as a window of its host time."""
        from dataclasses import replace

        import polars as pl

        from stepscope.analysis import engine_calls, windows
        from stepscope.analysis.steps import (DEVICE_TO_HOST, ENGINE_MARK_GLOB, OPEN_END, VLLM_INPUT_PREP,
                                              VLLM_OUTPUT, trace_api_flags)

        reader = self.reader
        light = reader.read_marks(ENGINE_MARK_GLOB, lambda v: bool(VLLM_INPUT_PREP.search(v) or VLLM_OUTPUT.search(v)),
                                  DEVICE_TO_HOST)

        flagged = engine_calls.Flags(lambda: reader.base.strings)

        def launched(lo, hi):
            return reader.read(lo, None if hi >= OPEN_END else hi + 1, count=False).kernels

        def with_calls(calls):  # the names the reads have learnt so far
            return replace(light, api=calls, strings=reader.base.strings)

        def steps(calls):
            return windows.engine_plan(with_calls(calls), launched)

        if light.kernels.is_empty():  # no kernel of vLLM's loop: no engine step, and no call read
            return steps(light.api)
        keys = engine_calls.mark_keys(light)
        first = reader.scan_calls(lambda c: engine_calls.is_mark(flagged(c), keys)).drop("_pos")
        spans = engine_calls.spans(light, trace_api_flags(with_calls(first)))
        keeper = engine_calls.Keeper(spans, keys)
        engine = steps(keeper.calls(reader.scan_calls(lambda c: keeper(flagged(c)))))
        if not engine_calls.lead_within(engine, spans):  # warm-up runs past the leading iterations
            engine = steps(reader.scan_calls(lambda c: pl.repeat(True, c.height, eager=True)).drop("_pos"))
        return engine

    def state(self):
        return self.reader

    @classmethod
    def from_state(cls, path: Path, state) -> "_Reader":
        r = cls.__new__(cls)
        r.reader, r.base, r.n_kernels, r.sidecar_warning = state, state.base, state.n_kernels, None
        return r

    def account(self):
        return self.reader.account()

    def add_account(self, account) -> None:
        self.reader.add_account(account)

    def trace_with_warnings(self):
        """The trace's frames beside its events, with the whole read's warnings (every window's
        reading counted once, in the whole read's order) and the sidecar's."""
        from dataclasses import replace

        return replace(self.base, warnings=self.reader.warnings()
                       + ([self.sidecar_warning] if self.sidecar_warning else []))

    def close(self) -> None:
        self.reader.close()


def _source(path: Path):
    return _Reader(path)
