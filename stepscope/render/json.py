"""The stable JSON document of `stepscope analyze --json` (schema in the README).

The document is written as text by polars (stepscope/jsontext.py): a million-kernel trace's
per-step kernel lists, gaps and histograms are encoded column-wise and joined, never held as
Python objects. Small documents are re-indented for people; big ones stay compact.
"""

from __future__ import annotations

import json

import polars as pl

from stepscope import jsontext
from stepscope.analysis.inventory import Inventory
from stepscope.paths import shown
from stepscope.selection import parse_steps

STEP_FIELDS = (
    "step_time_ns", "n_kernels", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
    "n_launch_calls", "launch_call_ns", "layers", "kernels_per_layer",
)
INDENT_MAX_STEPS = 64  # above this many steps the document is written compact


def trace_dict(inv: Inventory) -> dict:
    t = inv.trace
    return {"path": shown(t.path), "nsys_version": t.nsys_version, "schema_version": t.schema_version}


def gpus_list(inv: Inventory) -> list[dict]:
    return inv.trace.gpus.to_dicts()


def steps_text(inv: Inventory, ids: list[int], diag=None) -> list[str]:
    """One JSON object per selected step, as text; `diag` (a Diagnosis) adds the gaps, launch
    and floors sections."""
    sel = list(ids)
    steps = inv.steps.filter(pl.col("step").is_in(sel)).rename({"step": "index"})
    head = steps.select(pl.col("index").alias("step"), jsontext.open_records(
        steps, ["index", "pid", "device", "delimiter", "name", "phase", *STEP_FIELDS]).alias("head"))
    classes = jsontext.members(inv.classes.filter(pl.col("step").is_in(sel)), "step", "class",
                               ["count", "time_ns"], "classes")
    kernels = jsontext.arrays(inv.kernels.filter(pl.col("step").is_in(sel)), "step",
                              ["name", "demangled", "class", "count", "time_ns"], "kernels")
    t = head.join(classes, on="step", how="left").join(kernels, on="step", how="left")
    parts = [pl.col("head"), pl.lit(',"classes":'), pl.col("classes").fill_null("{}"),
             pl.lit(',"kernels":'), pl.col("kernels").fill_null("[]")]
    if diag is not None:
        t = t.join(diag.sections_text(), on="step", how="left")
        parts += [pl.lit(',"gaps":'), pl.col("gaps"), pl.lit(',"launch":'), pl.col("launch"),
                  pl.lit(',"floors":'), pl.col("floors")]
    return t.sort("step").select(pl.concat_str(*parts, pl.lit("}"))).to_series().to_list()


def analyze_json(inv: Inventory, which=None, diag=None) -> str:
    """The document as JSON text: the steps `which` selects (a list of step ids, or a spec in
    stepscope.selection's grammar: an InputError when it selects none), with the sections
    `diag` adds (see steps_text)."""
    ids = list(which) if isinstance(which, list) else parse_steps(which, inv.step_ids())
    head = {"trace": trace_dict(inv), "gpus": gpus_list(inv), "warnings": inv.warnings}
    text = json.dumps(head, separators=(",", ":"), default=str)[:-1]
    text += ',"steps":[' + ",".join(steps_text(inv, ids, diag)) + "]}"
    return reindent(text) if len(ids) <= INDENT_MAX_STEPS else text


def analyze_document(inv: Inventory, which=None, diag=None) -> dict:
    """The document as Python objects (what the Python API's to_dict returns)."""
    return json.loads(analyze_json(inv, which, diag))


def reindent(text: str) -> str:
    try:
        import orjson
    except ImportError:
        return json.dumps(json.loads(text), indent=2)
    return orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode()


def dumps(doc: dict) -> str:
    """Indented JSON for other commands' documents (orjson when installed)."""
    try:
        import orjson
    except ImportError:
        return json.dumps(doc, indent=2, default=str)
    return orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2).decode()
