"""What every command does, as functions: load a trace, make one analysis, return its result.

sqlite-utils' shape: a command parses its options, calls one function here and renders what it
returns; the Python API (stepscope/__init__.py) exports the same functions. Each returns the
document its command's `--json` prints (or, for `report` and `export`, what it writes), and
raises StepscopeError, one line for the user, on bad input. Progress stages are named on the
way (render/progress.py: shown only on a terminal, while a command displays them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from stepscope.analysis.memory import EXPORT, NOTEBOOK, ONE_PASS, ONE_SHOT, Retention
from stepscope.errors import InputError
from stepscope.render import progress
from stepscope.selection import check_steps, parse_steps

TP_WIDTHS = (1, 2, 4, 8)


def bundled_trace() -> Path:
    """The real H200 decode-step trace shipped inside the package (the README's first command)."""
    return Path(str(resources.files("stepscope.data").joinpath("fixtures/default.sqlite")))


def load(trace: str | Path | None = None, step_regex: str | None = None, rules: str | Path | None = None, *,
         cache: bool = True, launch_config: bool = False, memory: Retention = NOTEBOOK):
    """Read a trace (nsys SQLite export or PyTorch-profiler JSON; None: the bundled one) and
    analyze its steps: the Inventory. `launch_config`: also read every kernel's grid and block
    (no command does: Inventory.step_acts reads a step's, the export reads them while writing);
    `cache=False` neither reads nor writes the Parquet
    cache (ingest/cache.py); `memory`: analysis/memory.py."""
    from stepscope.analysis.classify import load_rules
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.ingest import read_trace

    path = Path(trace or bundled_trace())
    progress.stage(f"reading {path.name}")
    t = read_trace(path, launch_config=launch_config, cache=None if cache else False)
    if t.cache_entry is not None:
        progress.notice(f"cached {path.name}'s frames in {t.cache_entry} (the next read of this export "
                        "skips SQLite; --no-cache reads without it)")
    progress.stage(f"analyzing {t.kernels.height:,} kernels of {path.name}")
    # read without grid/block; the few kernels whose launch configuration is phase evidence
    # are read from the export when a step's name records no phase
    reader = None
    if t.format == "nsys-sqlite" and not launch_config:
        from stepscope.launch_config import nsys_reader

        reader = nsys_reader(t.path)
    elif t.format in ("nsys-arrow", "nsys-parquet") and not launch_config:
        from stepscope.launch_config import ColumnarLaunchConfig

        reader = ColumnarLaunchConfig(t.path, "arrow" if t.format == "nsys-arrow" else "parquetdir")
    return analyze_trace(t, step_regex, load_rules(rules), memory=memory, launch_config=reader)


def diagnosis(trace: str | Path | None = None, step_regex: str | None = None, rules: str | Path | None = None, *,
              cache: bool = True, launch_config: bool = False, memory: Retention = NOTEBOOK, steps: str | None = None):
    """load(), then gaps, launch overhead, floors and verdicts (the Diagnosis), narrowed to the
    steps `steps` selects (Diagnosis.only_steps) after the analyses ran on the whole trace."""
    from stepscope.analysis.diagnosis import diagnose

    check_steps(steps)
    inv = load(trace, step_regex, rules, cache=cache, launch_config=launch_config, memory=memory)
    progress.stage(f"finding gaps, launch overhead and floors of {Path(inv.trace.path).name}")
    return diagnose(inv).only_steps(steps)


def _diagnosis_of(x, step_regex, rules, cache: bool, steps: str | None, memory: Retention = ONE_PASS):
    """A trace given as a path, or as the Analysis open_trace returned. ONE_SHOT: only the
    per-step results are read after (the per-event frames go before the next trace is read)."""
    if hasattr(x, "diagnosis"):
        return x.diagnosis.only_steps(steps)
    d = diagnosis(x, step_regex, rules, cache=cache, steps=steps, memory=memory)
    memory.results_ready(d)
    return d


def compare(a, b, *, steps: str = "all", steps_b: str | None = None, step_regex: str | None = None,
            rules: str | Path | None = None, graph_gap_ns: float | None = None,
            graph_launch_ns: float | None = None, cache: bool = True) -> dict:
    """Two traces side by side (paths, or Analysis objects): the `compare --json` document."""
    from stepscope import options as opt
    from stepscope.analysis.compare import compare as compared
    from stepscope.analysis.whatif import DEFAULT, GraphConstants
    from stepscope.render.sentences import compare_sentence, untraced_source

    check_steps(steps)
    check_steps(steps_b)
    opt.number(graph_gap_ns, "--graph-gap-ns", 0, opt.MAX_GRAPH_NS)
    opt.number(graph_launch_ns, "--graph-launch-ns", 0, opt.MAX_GRAPH_NS)
    consts = GraphConstants(
        graph_gap_ns if graph_gap_ns is not None else DEFAULT.node_gap_ns,
        graph_launch_ns if graph_launch_ns is not None else DEFAULT.graph_launch_lead_ns,
        DEFAULT.source if graph_gap_ns is None and graph_launch_ns is None else "given on the command line",
    )
    # compare reads each side's per-step results only: one trace's events are gone before the other's are read
    da = _diagnosis_of(a, step_regex, rules, cache, steps, ONE_SHOT)
    db = _diagnosis_of(b, step_regex, rules, cache, steps if steps_b is None else steps_b, ONE_SHOT)
    doc = compared(da, db, consts)
    for tag, d in (("a", da), ("b", db)):
        if "untraced_source" in doc[tag]:
            doc[tag]["untraced_source"] = untraced_source(doc[tag]["untraced_source"], d.inv.trace.sidecar)
    doc["verdict"] = compare_sentence(doc)
    return doc


def parse_widths(text: str | Sequence[int]) -> list[int]:
    """TP widths from `1,2,4,8` (or a list of them), each from 1 to options.MAX_WIDTH."""
    from stepscope.options import MAX_WIDTH
    from stepscope.selection import is_index

    if not isinstance(text, str):
        text = ",".join(str(w) for w in text)
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(is_index(x) for x in parts):
        raise InputError(f"--widths takes comma-separated whole numbers like 1,2,4,8, not {text[:80]!r}")
    w = [int(x) for x in parts]
    if any(not 1 <= x <= MAX_WIDTH for x in w):
        raise InputError(f"--widths takes widths from 1 to {MAX_WIDTH:,}, not {text[:80]!r}")
    return w


def _mode(p) -> dict | None:
    return None if p is None else {"rows": p.rows, "launch_bound_from_tp": p.launch_bound_from_tp}


def tp(trace=None, *, widths: str | Sequence[int] = TP_WIDTHS, kernels: int | None = None,
       launch_us: float | None = None, device_ms: float | None = None, collective_us: float | None = None,
       steps: str = "all", step_regex: str | None = None, rules: str | Path | None = None,
       cache: bool = True) -> dict:
    """Equation 1.3 per tensor-parallel width, from a trace (path or Analysis) or from numbers
    alone (kernels, launch_us, device_ms): the `tp --json` document."""
    from stepscope import options as opt
    from stepscope.analysis import tp as tpm
    from stepscope.render.sentences import tp_note, tp_sentence

    check_steps(steps)
    ws = parse_widths(widths)
    opt.integer(kernels, "--kernels", 0, opt.MAX_KERNELS)
    opt.number(launch_us, "--launch-us", 0, opt.MAX_HOST_US)
    opt.number(device_ms, "--device-ms", 0, opt.MAX_DEVICE_MS)
    opt.number(collective_us, "--collective-us", 0, opt.MAX_COLLECTIVE_US)
    numbers = (kernels, launch_us, device_ms)
    if trace is None:
        if None in numbers:
            raise InputError("give a trace, or all of --kernels, --launch-us and --device-ms")
        layers = 32 if collective_us else 0
        proj = tpm.project(kernels, launch_us * 1e3, device_ms * 1e6, 0.0, ws, 1, layers,
                           (collective_us or 0) * 1e3 * tpm.ALLREDUCES_PER_LAYER)
        if collective_us:
            proj.notes.append(("collective_assumed", {"allreduces_per_layer": tpm.ALLREDUCES_PER_LAYER,
                                                      "allreduce_us": collective_us, "layers": layers}))
        return {"inputs": proj.inputs, "mode": "eager", "projection": proj.rows,
                "launch_bound_from_tp": proj.launch_bound_from_tp,
                "projections": {"eager": _mode(proj), "graph": None}, "notes": [tp_note(n) for n in proj.notes]}
    if any(v is not None for v in numbers):
        raise InputError("give either a trace or --kernels/--launch-us/--device-ms, not both")
    d = _diagnosis_of(trace, step_regex, rules, cache, steps)
    proj = tpm.project_trace(d, ws, collective_us)
    doc = {"inputs": proj.inputs, "mode": proj.mode, "projection": proj.own.rows,
           "launch_bound_from_tp": proj.own.launch_bound_from_tp,
           "projections": {"eager": _mode(proj.eager), "graph": _mode(proj.graph)},
           "notes": [tp_note(n) for n in proj.notes]}
    ranks = tpm.rank_rows(d)
    if ranks:
        doc["ranks"] = ranks
    # each TP step as the document gives it: its figures, then its verdict in words
    groups = [{k: g[k] for k in ("group", "ranks", "step_time_ns", "rank_skew_ns", "binding_rank")} | {"verdict": tp_sentence(g)} for g in tpm.tp_steps(d)]
    if groups:
        doc["tp_steps"] = groups
        skews = [g["rank_skew_ns"] for g in groups if g["rank_skew_ns"] is not None]
        doc["rank_skew_ns"] = max(skews) if skews else None
    return doc


def budget(trace, cells, *, model: str | None = None, batch: int | None = None, context: int | None = None,
           phase: str | None = None, steps: str | None = None) -> dict:
    """One step's HBM byte budget (the first step `steps` selects): each kernel joined to a
    measured cell of `cells`, next to the theoretical minimum and the bandwidth floor — the
    `budget --json` document. Model, phase, batch and context default to what the step's name
    (and the capture's sidecar) record."""
    import polars as pl

    from stepscope import options as opt
    from stepscope.analysis.steps import step_shape
    from stepscope.bytes.budget import budget as budgeted
    from stepscope.bytes.budget import budget_order, step_kernels_from_inventory, step_sequence_from_inventory
    from stepscope.bytes.cells import read_cells
    from stepscope.bytes.stepcells import is_step_cells
    from stepscope.paths import shown

    check_steps(steps)
    opt.integer(batch, "--batch", 1, opt.MAX_BATCH)
    opt.integer(context, "--context", 1, opt.MAX_CONTEXT)
    cells_path = Path(cells)
    table = read_cells(cells_path)
    inv = load(trace, memory=ONE_PASS)  # the step's grid/block, the join to cells: Inventory.step_acts
    if inv.steps.height == 0:
        raise InputError(f"{trace}: no steps found")
    picked = parse_steps(steps, inv.step_ids())
    sid = picked[0]
    if steps not in (None, "") and len(picked) > 1:
        progress.notice(f"budget of step {sid}, the first of the {len(picked)} steps selected")
    fig = inv.steps.filter(pl.col("step") == sid).row(0, named=True)
    # the step's name first; what stepscope trace recorded beside the export (vLLM's step names
    # carry neither the model nor the context) fills the rest
    shape = {**((inv.trace.sidecar or {}).get("shape") or {}), **step_shape(fig.get("name"))}
    model = model or shape.get("model")
    phase = phase or shape.get("phase") or fig.get("phase")
    batch = batch or shape.get("batch")
    context = context or shape.get("context")
    lacking = [n for n, v in (("--model", model), ("--phase", phase), ("--batch", batch),
                              ("--context", context)) if not v]
    if lacking:
        raise InputError(f"the step's name does not record {', '.join(lacking)}: pass them")
    gpus = inv.trace.gpus
    gpu_name = gpus["name"][0] if gpus.height else None
    peak = float(gpus["memory_bandwidth_bps"][0]) if gpus.height and gpus["memory_bandwidth_bps"][0] else None
    progress.stage(f"joining step {sid}'s kernels to {cells_path.name}")
    sk = step_kernels_from_inventory(inv, sid, memops=True)
    width = shape.get("tp") if isinstance(shape.get("tp"), int) else 1
    if is_step_cells(table):  # the step's own kernels, measured one by one in launch order
        res = budget_order(step_sequence_from_inventory(inv, sid), table, model, int(batch), int(context),
                           str(phase), gpu_name, peak, tp=width, memops=sk)
    else:
        res = budgeted(sk, table, model, int(batch), int(context), str(phase), gpu_name, peak, tp=width)
    doc = {"trace": shown(Path(trace)), "cells": shown(cells_path), "step_index": sid, "model": model,
           **res.to_dict()}
    doc["step"] = {**res.step, "model": model}
    return doc


@dataclass(frozen=True)
class Written:
    """What report() or export() made: the file's content, where it went (None: nowhere), the
    steps it shows, and (export) the number of GPU activities and the document.

    An export written to a file is streamed there and not kept: `content` and `document` read
    the file back when asked (an export of a million kernels is hundreds of MB of JSON)."""

    _content: str | bytes | None
    path: Path | None
    steps: tuple[int, ...]
    activities: int | None = None
    is_export: bool = False

    @functools.cached_property
    def content(self) -> str | bytes:
        if self._content is not None or self.path is None:
            return self._content
        raw = self.path.read_bytes()
        return raw if raw[:2] == b"\x1f\x8b" else raw.decode("utf-8")

    @functools.cached_property
    def document(self) -> dict | None:
        if not self.is_export:
            return None
        import gzip
        import json

        c = self.content
        return json.loads(gzip.decompress(c) if isinstance(c, bytes) else c)


def report(trace, output: str | Path | None = None, *, format: str | None = None, compare=None,
           cells=None, steps: str | None = None, compare_steps: str | None = None,
           step_regex: str | None = None, rules: str | Path | None = None) -> Written:
    """One step's report — timeline, classes, gaps, floors, verdict; with `compare`, a second
    trace's step beside it; with `cells`, the byte budget — as HTML or Markdown: `format`, else
    the extension of `output` picks it (render/report_data.RENDERERS). Written to `output`
    (all or nothing) when given."""
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.paths import refuse_overwrite
    from stepscope.render.output import write_atomic
    from stepscope.render.report_data import ReportView, budget_for, chosen, pick_step, renderer, step_view

    render = renderer(format or (Path(output).suffix if output is not None else ".html"), output)
    check_steps(steps)  # a bad selection fails before any trace is read
    check_steps(compare_steps)
    if output is not None:
        refuse_overwrite(Path(output), [None if p is None else Path(p) for p in (trace, compare, cells, rules)])

    def view(path, which):
        inv = load(path, step_regex, rules, memory=ONE_PASS)  # the budget's grid/block: Inventory.step_acts
        progress.stage(f"finding gaps, launch overhead and floors of {Path(path).name}")
        d = diagnose(inv)  # once: the picked step, its floors and its TP peers all read it
        return inv, step_view(inv, pick_step(inv, which, d), d, chosen=chosen(inv, which))

    inv, first = view(trace, steps)
    other = view(compare, compare_steps)[1] if compare is not None else None
    budget_rows, note = budget_for(inv, first, cells)
    if output is not None:
        progress.stage(f"writing {Path(output).name}")
    text = render(ReportView(first, other, budget_rows, note))
    if output is not None:
        write_atomic(Path(output), text)
    return Written(text, None if output is None else Path(output),
                   (first.step,) + ((other.step,) if other is not None else ()))


def export(trace, output: str | Path | None = None, *, steps: str = "all", step_regex: str | None = None,
           rules: str | Path | None = None) -> Written:
    """Chosen steps as Chrome-trace JSON for ui.perfetto.dev (render/perfetto.py), gzipped when
    `output` ends in .gz; written to `output` (all or nothing) when given."""
    import polars as pl

    from stepscope.paths import refuse_overwrite
    from stepscope.render.output import write_atomic_with
    from stepscope.render.perfetto import export_chunks, write_export

    if output is not None:
        refuse_overwrite(Path(output), [None if p is None else Path(p) for p in (trace, rules)])
    check_steps(steps)  # a bad selection fails before the trace is read
    inv = load(trace, step_regex, rules, memory=EXPORT)  # grid/block: read while writing (render/perfetto.py)
    ids = parse_steps(steps, inv.step_ids())
    progress.stage(f"writing {len(ids)} step(s)" + (f" to {Path(output).name}" if output is not None else ""))
    n = inv.acts.select(pl.col("step").is_in([int(i) for i in ids]).sum()).item()
    if output is None:
        return Written("".join(export_chunks(inv, ids)), None, tuple(ids), n, True)
    gz = Path(output).suffix.lower() == ".gz"
    write_atomic_with(Path(output), lambda tmp: write_export(inv, ids, tmp, gz))
    return Written(None, Path(output), tuple(ids), n, True)
