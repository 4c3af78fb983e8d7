"""`stepscope budget TRACE --cells CELLS`: one step's HBM bytes, measured vs minimum.

Registered from stepscope/commands/cells.py (imported by cli.py), so cli.py carries a single
registration line for the byte side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from stepscope.cli import app, fail


def _b(x) -> str:
    if x is None:
        return "—"
    sign = "-" if x < 0 else ""
    x = abs(x)
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= div:
            return f"{sign}{x / div:.2f} {unit}"
    return f"{sign}{int(x)} B"


@app.command("budget")
def budget_cmd(
    trace: Path = typer.Argument(..., help="nsys SQLite export of the engine step(s)"),
    cells: Path = typer.Option(..., "--cells", help="cells file from `stepscope cells run/import`"),
    model: Optional[str] = typer.Option(None, help="model card (default: from the step's NVTX name)"),
    batch: Optional[int] = typer.Option(None, help="sequences in the step"),
    context: Optional[int] = typer.Option(None, help="context length (decode) / prompt length (prefill)"),
    phase: Optional[str] = typer.Option(None, help="decode | prefill"),
    step: Optional[int] = typer.Option(None, help="step index (default: the first step)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Join each kernel of a step to a measured byte cell; bytes, minimum, removable, floor."""
    from stepscope import options as opt
    from stepscope.errors import StepscopeError

    try:
        opt.integer(batch, "--batch", 1, opt.MAX_BATCH)
        opt.integer(context, "--context", 1, opt.MAX_CONTEXT)
        doc, res = _run(trace, cells, model, batch, context, phase, step)
    except StepscopeError as e:
        fail(str(e), e.exit_code)
        return
    if as_json:
        typer.echo(json.dumps(doc, indent=1, default=str))
    else:
        _render(doc, res)


def _run(trace, cells_path, model, batch, context, phase, step):
    import polars as pl

    from stepscope.analysis.steps import step_shape
    from stepscope.api import open_trace
    from stepscope.bytes.budget import budget, step_kernels_from_inventory
    from stepscope.bytes.cells import read_cells
    from stepscope.errors import InputError
    from stepscope.paths import shown

    cells = read_cells(cells_path)
    an = open_trace(trace)
    inv = an.inventory
    if inv.steps.height == 0:
        raise InputError(f"{trace}: no steps found")
    ids = inv.step_ids()
    sid = ids[0] if step is None else step
    if sid not in ids:
        raise InputError(f"{trace}: no step {sid} (steps: {ids[0]}..{ids[-1]})")
    fig = inv.steps.filter(pl.col("step") == sid).row(0, named=True)
    shape = step_shape(fig.get("name"))
    model = model or shape.get("model")
    phase = phase or shape.get("phase") or fig.get("phase")
    batch = batch or shape.get("batch")
    context = context or shape.get("context")
    lacking = [n for n, v in (("--model", model), ("--phase", phase), ("--batch", batch),
                              ("--context", context)) if not v]
    if lacking:
        raise InputError(f"the step's name does not record {', '.join(lacking)}: pass them")
    gpus = an.trace.gpus
    gpu_name = gpus["name"][0] if gpus.height else None
    peak = None
    if gpus.height and gpus["memory_bandwidth_bps"][0]:
        peak = float(gpus["memory_bandwidth_bps"][0])
    sk = step_kernels_from_inventory(inv, sid, memops=True)
    tp = shape.get("tp") if isinstance(shape.get("tp"), int) else 1
    res = budget(sk, cells, model, int(batch), int(context), str(phase), gpu_name, peak, tp=tp)
    doc = {"trace": shown(trace), "cells": shown(cells_path), "step_index": sid, "model": model,
           **res.to_dict()}
    doc["step"] = {**res.step, "model": model}
    return doc, res


def _render(doc, res) -> None:
    from rich.console import Console
    from rich.table import Table

    from stepscope.render.names import term

    con = Console()
    st = doc["step"]
    t = Table(title=f"HBM byte budget — step {doc['step_index']} ({term(st['phase'])}, batch "
              f"{st['batch']}, context {st['context']}, {term(doc['model'])}) on {term(doc['gpu'] or '?')}")
    for c in ("class", "op", "calls", "bytes/call", "measured", "minimum", "ampl.",
              "removable", "floor", "kernel time"):
        t.add_column(c, justify="left" if c in ("class", "op") else "right")
    for r in res.rows.iter_rows(named=True):
        amp = r["amplification"]
        t.add_row(term(r["class"]), term(r["op"]) if r["op"] else "[dim](no cell)[/]", str(r["calls"]),
                  _b(r["measured_bytes_per_call"]), _b(r["measured_bytes"]), _b(r["min_bytes"]),
                  f"{amp:.2f}" if amp is not None else "—", _b(r["removable_bytes"]),
                  f"{r['floor_ns'] / 1e3:.1f} µs" if r["floor_ns"] is not None else "—",
                  f"{r['time_ns'] / 1e3:.1f} µs")
    t.add_row("[bold]step[/]", "", str(st["calls"]), "", _b(st["measured_bytes"]),
              _b(st["min_bytes"]),
              f"{st['amplification']:.2f}" if st["amplification"] else "—",
              _b(st["removable_bytes"]),
              f"{st['floor_ns'] / 1e3:.1f} µs" if st["floor_ns"] is not None else "—",
              f"{st['time_ns'] / 1e3:.1f} µs")
    con.print(t)
    ranked = [c for c in doc["classes"] if c["removable_bytes"] is not None]
    if ranked:
        con.print("classes by removable bytes: " + ", ".join(
            f"{term(c['class'])} {_b(c['removable_bytes'])}" for c in ranked[:5]))
    j = st["joined"]
    con.print(f"joined: {j['launch']} calls by kernel+grid+block, {j['name']} by name only, "
              f"{j['op']} by op, {j.get('trace', 0)} memops by their trace bytes; {len(st['unjoined_kernels'])} kernel(s) without a cell")
    for u in st["unjoined_kernels"][:15]:
        con.print(f"  [yellow]no cell[/] {term(u['class']):<16} {u['count']:>4}× {term(u['name'])}"
                  + (f" [dim]({term(u['reason'])})[/]" if u.get("reason") else ""))
    for w in doc.get("warnings", []):
        con.print(f"[yellow]warning:[/] {term(w, 2000)}")
