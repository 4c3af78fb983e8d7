"""When and how `analyze` reads a long trace by windows of steps (analysis/windows.py): the
export's size decides, the reader gives each window's events, and a progress bar counts them.

A trace of more than WINDOW_MIN_KERNELS kernels whose steps are NVTX step ranges is analyzed
WINDOW_KERNELS kernels at a time (about; by its steps' mean size), so that memory holds one
window's events, not the run's: docs/PERFORMANCE.md, "A long run in bounded memory". Any other
trace, and any trace `plan` or a window finds unfit (analysis/windows.WholeTrace), is analyzed
whole, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

# below this many kernels the whole trace is read at once (its frames, a few hundred MB at most)
WINDOW_MIN_KERNELS = 2_000_000
# the kernels a window holds, about: ~0.3 GB while it is analyzed
WINDOW_KERNELS = 500_000


def window_steps_for(n_kernels: int, n_ranges: int, given: int | None) -> int:
    """How many step ranges a window owns: `given` (the user's --window-steps; 0: none), else
    WINDOW_KERNELS worth of steps, for a trace of more than WINDOW_MIN_KERNELS kernels."""
    if given is not None:
        return given
    env = os.environ.get("STEPSCOPE_WINDOW_STEPS")
    if env:
        return int(env)
    if n_kernels <= WINDOW_MIN_KERNELS or not n_ranges:
        return 0
    per_step = max(1, n_kernels // n_ranges)
    return max(1, WINDOW_KERNELS // per_step)


def diagnosis(path: Path, step_regex, rules, calibration, window_steps: int | None = None):
    """The Diagnosis of the nsys SQLite export `path` analyzed by windows, or None when it is
    analyzed whole (not an nsys SQLite export, too small, or its steps unfit for windows)."""
    from stepscope.analysis import windows
    from stepscope.analysis.classify import load_rules
    from stepscope.ingest.nsys_sqlite import is_sqlite
    from stepscope.render import progress

    if window_steps == 0 or not is_sqlite(path):
        return None
    source = _source(path)
    if source is None:
        return None
    try:
        n = window_steps_for(source.n_kernels, source.n_ranges(step_regex), window_steps)
        if n <= 0:
            return None
        p = windows.plan(source.base.nvtx, step_regex, n)
        if not p.windows:
            return None
        total = len(p.windows)

        def pairs():
            for i, w in enumerate(p.windows):
                progress.bar(f"analyzing {path.name} by windows of {n:,} steps", i, total)
                yield w, source.read(w.lo, w.hi)
            progress.bar(f"analyzing {path.name} by windows of {n:,} steps", total, total)

        try:
            return windows.analyze_by_windows(source.base_with_warnings, p, step_regex, load_rules(rules),
                                              None, calibration, windows=pairs())
        except windows.WholeTrace:
            return None
    finally:
        source.close()


class _InMemory:
    """Windows cut from the whole trace read at once: the reference the window reader is
    tested against, and the source where it cannot read the export."""

    def __init__(self, path: Path):
        from stepscope.ingest import read_trace

        self.trace = read_trace(path, cache=False)
        self.n_kernels = self.trace.kernels.height
        self.base = self.trace
        self.base_with_warnings = self.trace

    def n_ranges(self, step_regex) -> int:
        from stepscope.analysis.steps import _windows_nvtx

        return _windows_nvtx(self.base.nvtx, step_regex).height

    def read(self, lo, hi):
        from stepscope.analysis.windows import Window, window_trace

        return window_trace(self.trace, Window(0, lo, hi, lo, hi))

    def close(self) -> None:
        pass


def _source(path: Path):
    return _InMemory(path)
