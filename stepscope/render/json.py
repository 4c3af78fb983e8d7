"""The stable JSON document of `stepscope analyze --json` (schema in the README)."""

from __future__ import annotations

import json

import polars as pl

from stepscope.analysis.inventory import Inventory

STEP_FIELDS = (
    "step_time_ns", "n_kernels", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
    "n_launch_calls", "launch_call_ns", "layers", "kernels_per_layer",
)


def select_steps(inv: Inventory, which: str | int | None) -> list[int]:
    ids = inv.step_ids()
    if which in (None, "all"):
        return ids
    if which == "first":
        return ids[:1]
    return [int(which)] if int(which) in ids else []


def trace_dict(inv: Inventory) -> dict:
    t = inv.trace
    return {"path": str(t.path), "nsys_version": t.nsys_version, "schema_version": t.schema_version}


def gpus_list(inv: Inventory) -> list[dict]:
    return inv.trace.gpus.to_dicts()


def steps_list(inv: Inventory, ids: list[int], extra=None) -> list[dict]:
    """One dict per step; `extra(step_id) -> dict` adds sections (gaps, launch, floors)."""
    sel = list(ids)
    steps = inv.steps.filter(pl.col("step").is_in(sel))
    classes = inv.classes.filter(pl.col("step").is_in(sel))
    kernels = inv.kernels.filter(pl.col("step").is_in(sel))
    from stepscope.analysis.diagnosis import by_step  # polars builds the per-step row dicts

    by_step_cls = {
        step: {r["class"]: {"count": r["count"], "time_ns": r["time_ns"]} for r in rows}
        for step, rows in by_step(classes.select("step", "class", "count", "time_ns")).items()
    }
    by_step_k = by_step(kernels.select("step", "name", "demangled", "class", "count", "time_ns"))
    out = []
    for r in steps.iter_rows(named=True):
        d = {"index": r["step"], "pid": r["pid"], "device": r["device"], "delimiter": r["delimiter"],
             "name": r["name"], "phase": r["phase"]}
        d.update({f: r[f] for f in STEP_FIELDS})
        d["classes"] = by_step_cls.get(r["step"], {})
        d["kernels"] = by_step_k.get(r["step"], [])
        if extra is not None:
            d.update(extra(r["step"]))
        out.append(d)
    return out


def analyze_document(inv: Inventory, which=None, extra=None) -> dict:
    return {
        "trace": trace_dict(inv),
        "gpus": gpus_list(inv),
        "warnings": inv.warnings,
        "steps": steps_list(inv, select_steps(inv, which), extra),
    }


def dumps(doc: dict) -> str:
    """Indented JSON. orjson when installed (5x faster on million-kernel documents); otherwise
    the standard library, compact for long documents (its C encoder runs only without indent)."""
    try:
        import orjson
    except ImportError:
        big = len(doc.get("steps", ())) > 64
        return json.dumps(doc, indent=None if big else 2, separators=(",", ":") if big else None, default=str)
    return orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2).decode()
