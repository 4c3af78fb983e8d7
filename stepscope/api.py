"""The Python API for notebooks: `stepscope.open_trace(path)` → an Analysis.

An Analysis holds what `stepscope analyze` computes — the inventory (steps, classes, kernels)
and the diagnosis (gaps, launch overhead, floors, verdicts) — as polars frames, reads the trace
the same way the command does, and gives the same document: `to_dict()` is `analyze --json`.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import polars as pl

from stepscope.analysis.gaps import KINDS
from stepscope.analysis.inventory import Inventory

PANDAS_HINT = "to_pandas() needs pandas and pyarrow: pip install 'stepscope[pandas]'"


def _pandas_ready() -> None:
    """pandas at the edge only (the extra stepscope[pandas]): one line saying how to get it."""
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        raise ImportError(PANDAS_HINT) from None


class Step:
    """One engine step: its figures (a row of Analysis.table, also as attributes: s.verdict,
    s.step_time_ns, …) and its class and kernel tables."""

    def __init__(self, figures: dict, classes: pl.DataFrame, kernels: pl.DataFrame):
        self.figures = figures
        self.classes = classes  # class, count, time_ns
        self.kernels = kernels  # name, demangled, class, count, time_ns, class_by

    @property
    def index(self) -> int:
        return self.figures["index"]

    def __getattr__(self, name):
        try:
            return self.__dict__["figures"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __dir__(self):
        # the figures are attributes too (s.verdict, s.step_time_ns): tab completion shows them
        return sorted(set(super().__dir__()) | set(self.figures))

    def __repr__(self) -> str:
        from stepscope.render.notebook import step_repr

        return step_repr(self.figures)

    def _repr_html_(self) -> str:
        from stepscope.render.notebook import step_html

        return step_html(self.figures, self.classes)

    def to_pandas(self):
        """The step's kernels as a pandas DataFrame."""
        _pandas_ready()
        return self.kernels.to_pandas()


class Analysis:
    """A trace, its steps and their verdicts (what `stepscope analyze` reports)."""

    def __init__(self, inventory: Inventory, diagnosis=None):
        self.inventory = inventory
        self.trace = inventory.trace
        from stepscope.render.sentences import warning_texts

        self.warnings = warning_texts(inventory.warnings)
        # the capture's own defects (analysis/capture_check.py): one row per defect, before any step
        self.capture = inventory.capture
        if diagnosis is not None:
            self.__dict__["diagnosis"] = diagnosis

    @cached_property
    def diagnosis(self):
        """Gaps, launch overhead, floors and verdicts (analysis/diagnosis.py), computed once."""
        from stepscope.analysis.diagnosis import diagnose

        return diagnose(self.inventory)

    @cached_property
    def table(self) -> pl.DataFrame:
        """One row per step: every figure of DEFINITIONS.md, the floors and the verdict (the
        verdict frame, analysis/verdict.py) and the gaps by kind (`<kind>_gaps`, `<kind>_gap_ns`);
        the step's number is `index`, as in analyze --json."""
        d = self.diagnosis
        per_kind = [e for k in KINDS for e in (
            pl.col("count").filter(pl.col("kind") == k).sum().alias(f"{k}_gaps"),
            pl.col("time_ns").filter(pl.col("kind") == k).sum().alias(f"{k}_gap_ns"))]
        gaps = d.gap_totals.group_by("step").agg(*per_kind).drop("host_bound_gap_ns")
        from stepscope.render.sentences import with_untraced_source

        verdicts = with_untraced_source(d.verdicts, self.trace.sidecar)
        return (self.inventory.steps.join(verdicts, on="step", how="left")
                .join(gaps, on="step", how="left").sort("step").rename({"step": "index"}))

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The steps in order, built once (each class and kernel table split off in one pass)."""
        inv = self.inventory
        classes = inv.classes.partition_by("step", as_dict=True, include_key=False)
        kernels = inv.kernels.partition_by("step", as_dict=True, include_key=False)
        empty_c, empty_k = inv.classes.clear().drop("step"), inv.kernels.clear().drop("step")
        return tuple(Step(fig, classes.get((fig["index"],), empty_c), kernels.get((fig["index"],), empty_k))
                     for fig in self.table.iter_rows(named=True))

    def step(self, index: int) -> Step:
        """The step whose index (the table's `index` column) is `index`."""
        by_index = self.__dict__.get("_by_index") or {s.index: s for s in self.steps}
        self.__dict__["_by_index"] = by_index
        return by_index[index]

    def __len__(self) -> int:
        return self.inventory.steps.height

    def __repr__(self) -> str:
        from stepscope.render.notebook import analysis_repr

        t = self.table
        verdicts = t.group_by("verdict").len().sort("len", descending=True).rows() if t.height else []
        return analysis_repr(Path(self.trace.path).name, t, verdicts)

    def _repr_html_(self) -> str:
        from stepscope.render.notebook import analysis_html

        from stepscope.render.capture import defect_line, defect_rows, shown_warnings

        return analysis_html(Path(self.trace.path).name, self.table, shown_warnings(self.inventory),
                             [defect_line(r) for r in defect_rows(self.inventory)])

    def to_pandas(self):
        """Analysis.table as a pandas DataFrame."""
        _pandas_ready()
        return self.table.to_pandas()

    def to_dict(self, steps="all") -> dict:
        """The `analyze --json` document of the steps `steps` selects (stepscope.selection)."""
        from stepscope.pipeline import result_of
        from stepscope.render.json import analyze_document

        return analyze_document(result_of(self.diagnosis, steps))


def open_trace(path: str | Path, step_regex: str | None = None, rules: str | Path | None = None, *,
               cache: bool = True) -> Analysis:
    """Read an nsys SQLite export (or PyTorch-profiler trace) and analyze its steps, as
    `stepscope analyze` does. A step's kernels with their grid and block:
    `inventory.step_acts(step)` (read from the export for that step alone); the trace's raw
    kernel, memop and API frames are let go once the analysis holds their rows, and read again
    from its file by `a.trace.read_events()` (analysis/memory.py NOTEBOOK)."""
    from stepscope import library

    return Analysis(library.load(path, step_regex, rules, cache=cache))
