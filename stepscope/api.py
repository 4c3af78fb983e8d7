"""The Python API for notebooks: `stepscope.open_trace(path)`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from stepscope.analysis.classify import load_rules
from stepscope.analysis.inventory import Inventory, analyze_trace
from stepscope.ingest import read_trace


@dataclass
class Step:
    """One engine step: its figures and its inventory frames."""

    index: int
    figures: dict
    classes: pl.DataFrame  # class, count, time_ns
    kernels: pl.DataFrame  # name, demangled, class, count, time_ns

    def __getattr__(self, name):
        try:
            return self.figures[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_pandas(self):
        return self.kernels.to_pandas()


class Analysis:
    """A trace and its per-step inventory."""

    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        self.trace = inventory.trace
        self.warnings = inventory.warnings

    @property
    def table(self) -> pl.DataFrame:
        """One row per step with every figure of DEFINITIONS.md."""
        return self.inventory.steps

    @property
    def steps(self) -> list[Step]:
        inv = self.inventory
        out = []
        for fig in inv.steps.iter_rows(named=True):
            i = fig["step"]
            out.append(Step(
                i, fig,
                inv.classes.filter(pl.col("step") == i).drop("step"),
                inv.kernels.filter(pl.col("step") == i).drop("step"),
            ))
        return out

    def to_pandas(self):
        return self.table.to_pandas()

    def to_dict(self, steps="all") -> dict:
        from stepscope.render.json import analyze_document

        return analyze_document(self.inventory, steps)


def open_trace(path: str | Path, step_regex: str | None = None, rules: str | Path | None = None) -> Analysis:
    """Read an nsys SQLite export (or PyTorch-profiler trace) and analyze its steps."""
    return Analysis(analyze_trace(read_trace(path), step_regex, load_rules(rules)))
