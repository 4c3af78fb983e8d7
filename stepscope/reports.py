"""The reports of one run: which files a command line names, and the per-report work.

One run past one GPU is many exports (one per rank, `nsys profile -o report_%q{RANK}`, or one
per node). Each report is analyzed alone by `report_result` — the same diagnosis as
`stepscope analyze REPORT` — into a few small frames: per step the figures that do not depend
on the other ranks, and the collective kernels' intervals, which analysis/reports_run.py matches
across the reports. That function is what a dask worker runs (stepscope/distribute.py, the nsys
recipe's `--mode dask-futures`): it reads its report from a path the worker can see, and only
the small frames travel back.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stepscope.errors import InputError, StepscopeError
from stepscope.paths import shown

# what a directory given on the command line contributes: nsys SQLite exports
REPORT_GLOB = "*.sqlite"
# the per-step figures a report sends back (its inventory's, then the floors' inputs)
STEP_COLUMNS = ("step", "pid", "device", "delimiter", "name", "phase", "step_begin", "step_end", "step_time_ns",
                "n_kernels", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns", "n_launch_calls",
                "launch_call_ns", "layers", "kernels_per_layer")
# host_pause_ns: the GPU's idle time in host pauses, which the run's what-if keeps as analyze's does
FLOOR_COLUMNS = ("t_launch_ns", "cpu_floor_ns", "host_bound_gap_ns", "host_pause_ns")


@dataclass
class ReportResult:
    """What one report's analysis sends back: small frames, no per-kernel rows but its
    collectives (a few hundred per step)."""

    path: str                   # as given (shown)
    start_utc_ns: int | None    # its session's start (ingest/session.py); None: not recorded
    host: str | None
    nsys_version: str | None
    schema_version: str | None
    gpus: list[dict]
    warnings: list[str]
    steps: pl.DataFrame         # STEP_COLUMNS + FLOOR_COLUMNS + the what-if's prologue figures (whatif.FIGURES), replayed
    classes: pl.DataFrame       # step, class, count, time_ns
    collectives: pl.DataFrame   # inventory.COLLECTIVE_SCHEMA, on the report's own clock
    touching: pl.DataFrame      # (step) where a collective overlaps another activity
    other: pl.DataFrame         # (step, start, end): those steps' other activities
    kernels: int = 0            # the report's kernel count
    scheduling: str = "sync"    # whatif.scheduling of the report: "async" when its steps' replays can queue


@dataclass
class ReportFailure:
    """A report that could not be analyzed: its path and the one line saying why."""

    path: str
    message: str
    exit_code: int = 2
    extra: dict = field(default_factory=dict)


def report_result(path: str | Path, step_regex: str | None = None, rules: str | Path | None = None,
                  cache: bool = True) -> ReportResult:
    """Analyze one report (what `stepscope analyze PATH` computes) and keep what the run needs."""
    from stepscope import library
    from stepscope.analysis.collectives import other_activities, touching_steps
    from stepscope.analysis.memory import ONE_SHOT
    from stepscope.analysis.whatif import scheduling
    from stepscope.ingest.session import session_clock

    d = library.diagnosis(path, step_regex, rules, cache=cache, memory=ONE_SHOT)
    inv = d.inv
    clock = session_clock(path)
    replayed = d.graph_prediction.select("step", replayed=pl.col("predicted_graph_step_time_ns").is_null())
    steps = (inv.steps.select(*STEP_COLUMNS)
             .join(d.floors.select("step", *FLOOR_COLUMNS), on="step", how="left")
             .join(d.prologue.select("step", "prologue_launches", "prologue_host_ns", "prologue_busy_ns",
                                     "forward_kernels", "forward_memops"), on="step", how="left")
             .join(replayed, on="step", how="left").sort("step"))
    acts = inv.in_steps("step", "start", "end", "prev_end", "class", "is_kernel")
    touching = touching_steps(acts)
    other = other_activities(acts, touching)
    n_kernels = int(inv.steps["n_kernels"].sum() or 0)
    t = inv.trace
    out = ReportResult(shown(path), clock.start_utc_ns, clock.host, t.nsys_version, t.schema_version,
                       t.gpus.to_dicts(), list(inv.warnings), steps, inv.classes.clone(), inv.collectives.clone(),
                       touching, other, n_kernels, scheduling(inv))
    ONE_SHOT.results_ready(d)
    return out


def report_outcome(path: str, step_regex: str | None = None, rules: str | None = None,
                   cache: bool = True) -> ReportResult | ReportFailure:
    """report_result, with any failure turned into a ReportFailure naming the report: what a
    worker returns (an exception of polars' or ADBC's Rust code may not travel back whole)."""
    try:
        return report_result(path, step_regex, rules, cache)
    except StepscopeError as e:
        return ReportFailure(shown(path), str(e), e.exit_code)
    except MemoryError:
        return ReportFailure(shown(path), "ran out of memory analyzing it: give the worker more memory", 2)
    except Exception as e:  # noqa: BLE001 - a bug: one line, exit 3, as the CLI says of any other
        return ReportFailure(shown(path), f"internal error ({type(e).__name__}: {e})", 3)


def _natural(p: str) -> list:
    """report_2 before report_10."""
    return [int(x) if x.isdigit() else x for x in re.split(r"([0-9]+)", p)]


def expand_reports(args: list[str | Path]) -> list[Path]:
    """The reports the command line names: files as given, a directory's nsys exports
    (REPORT_GLOB, in natural order), a glob pattern's matches (natural order). The same file
    named twice is refused: its rank would be counted twice."""
    out: list[Path] = []
    for a in args:
        text = os.fspath(a)
        p = Path(text)
        try:
            is_dir, exists = p.is_dir(), p.exists()
        except OSError:  # a name too long, a symlink loop: reading it says what is wrong
            is_dir, exists = False, True
        if is_dir:
            found = sorted(glob.glob(os.path.join(glob.escape(text), REPORT_GLOB)), key=_natural)
            if not found:
                raise InputError(f"{shown(text)} is a directory with no nsys SQLite export ({REPORT_GLOB}) in it: give "
                                 "an export, or a directory of a run's exports (nsys export --type sqlite REPORT)")
            out += [Path(f) for f in found]
        elif not exists and glob.has_magic(text):
            found = sorted((f for f in glob.glob(text) if Path(f).is_file()), key=_natural)
            if not found:
                raise InputError(f"{shown(text)} matches no file")
            out += [Path(f) for f in found]
        else:
            out.append(p)
    from stepscope.paths import input_file

    out = [input_file(p, "an nsys SQLite export") for p in out]  # before any worker starts
    seen: dict = {}
    for p in out:
        try:
            key = p.resolve()
        except OSError:
            key = p
        if key in seen:
            raise InputError(f"{shown(p)} is given twice (also as {shown(seen[key])}): each report of a run once")
        seen[key] = p
    return out
