"""The reports of one run: which files a command line names, and what each report's work sends
back.

One run past one GPU is many exports (one per rank, `nsys profile -o report_%q{RANK}`, or one
per node). Each report is analyzed alone by `library.report_result` — the same diagnosis as
`stepscope analyze REPORT` — into a few small frames (ReportResult): per step the figures that
do not depend on the other ranks, and the collective kernels' intervals, which
analysis/reports_run.py matches across the reports. That function is what a dask worker runs
(stepscope/distribute.py, the nsys recipe's `--mode dask-futures`): it reads its report from a
path the worker can see, and only the small frames travel back. This module imports neither
the library nor the scheduler (no import circle through it).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stepscope.errors import InputError
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
