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
         cache: bool = True, launch_config: bool = False, memory: Retention = NOTEBOOK, strict: bool = False,
         events: bool = True):
    """Read a trace (nsys SQLite export or PyTorch-profiler JSON; None: the bundled one) and
    analyze its steps: the Inventory. `launch_config`: also read every kernel's grid and block
    (no command does: Inventory.step_acts reads a step's, the export reads them while writing);
    `cache=False` neither reads nor writes the Parquet
    cache (ingest/cache.py); `memory`: analysis/memory.py; `strict`: a `step_regex` that matches
    no range is an InputError, not a warning; `events=False`: the caller reads only the per-step
    results (a one-shot document, compare), so an analysis kept beside the frames is restored
    without its activities and launch calls (read up front otherwise)."""
    inv, key = _load(trace, step_regex, rules, cache, launch_config, memory, strict, events)
    inv.kept = key
    return inv


def _load(trace, step_regex, rules, cache: bool, launch_config: bool, memory: Retention, strict: bool = False,
          events: bool = True):
    """load()'s Inventory, and the key of its kept analysis (None: not kept; _analysis_key)."""
    from stepscope.analysis.classify import load_rules
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.ingest import read_trace

    path = Path(trace or bundled_trace())
    progress.stage(f"reading {path.name}")
    # a one-shot analysis kept with the frames needs none of the event frames: read on a miss
    try:
        t = read_trace(path, launch_config=launch_config, cache=None if cache else False,
                       events=not (memory.one_shot and cache and not launch_config))
    except InputError:
        _untraced_engine(path)  # an export without GPU work: say which processes it traced
        raise
    if t.cache_entry is not None:
        progress.notice(f"cached {path.name}'s frames in {t.cache_entry} (the next read of this export "
                        "skips SQLite; --no-cache reads without it)")
    # read without grid/block; the few kernels whose launch configuration is phase evidence
    # are read from the export when a step's name records no phase
    from stepscope.ingest.readers import launch_config_reader

    reader = None if launch_config else launch_config_reader(t)  # the format's, by the reader registry
    key = _analysis_key(t, step_regex, rules, memory, reader, strict) if not launch_config else None
    if key is not None:
        from stepscope.analysis.inventory import LATE_FIELDS, Inventory
        from stepscope.ingest.cache import load_derived

        got = load_derived(t.cache_dir, "analysis", key, lazy=LATE_FIELDS)
        if got is not None:
            frames, extra = got
            memory.activities_built(t)
            from stepscope.analysis.notes import from_data

            inv = Inventory.restored(t, frames, from_data(extra["warnings"]), reader, events=events)
            memory.inventory_built(inv)
            return inv, key
    # parsed only now: a kept analysis needs no rules (its key holds the rules file's bytes, which
    # parsed when it was kept), and parsing them is ~20 ms of a 0.7 s warm run
    ruleset = load_rules(rules)
    t.read_events()  # read without them for a kept analysis that is not there: the analysis reads them
    progress.stage(f"analyzing {t.kernels.height:,} kernels of {path.name}")
    inv = analyze_trace(t, step_regex, ruleset, memory=memory, launch_config=reader, strict=strict)
    if key is not None and not _keep_analysis(t, inv, key):
        key = None
    return inv, key


def _untraced_engine(path: Path) -> None:
    """Raise the capture's defect for an nsys export that recorded no kernel at all (the engine
    process not traced: analysis/capture_check.py); return when the file is anything else."""
    from stepscope.analysis.capture_check import untraced_line
    from stepscope.ingest.session import cuda_processes

    procs = cuda_processes(path)
    if procs is not None:
        raise InputError(untraced_line(path, procs)) from None


# The one-shot analysis of a cached export is a pure function of the export's frames, the
# rules, --step-regex, --strict and the analysis code: kept beside the frames (ingest/cache.py's
# derived entries), its next run skips the analysis of every activity (1M kernels: ~1 s of the warm
# run's ~2.7 s). Only for ONE_SHOT: the other policies keep other columns. Each derived entry is
# keyed by what decides its content, the code by a format version of its own: bump one when a
# change alters what that entry holds (a figure, a column, a warning), so that no entry kept by
# the code before is read by the code after (docs/PERFORMANCE.md, "The cache and the kept analysis").
ANALYSIS_FORMAT = 5  # the inventory's frames and warnings (5: graph_steps hold graph-level replays; 4: kernels carry class_by, analysis warnings as notes)
DIAGNOSIS_FORMAT = 1  # the diagnosis' calibration-free frames (_diagnosed)
TEXTS_FORMAT = 1  # each step's inventory part of the JSON document (step_texts)


@functools.cache
def _bundled_rules_digest() -> str:
    """The bundled classification rules as on disk (data/rules.toml): they decide the classes."""
    import hashlib

    return hashlib.sha256((Path(__file__).resolve().parent / "data" / "rules.toml").read_bytes()).hexdigest()


def _windows_code() -> str:
    """What of the code decides a kept analysis by windows (by_windows.py): the formats of the
    analysis and the diagnosis, the bundled rules ('' when they cannot be read: nothing is kept)."""
    try:
        return f"{ANALYSIS_FORMAT}|{DIAGNOSIS_FORMAT}|{_bundled_rules_digest()}"
    except OSError:
        return ""


def _entry_key(key: str, name: str, version: int) -> str:
    """The key of the derived entry `name` (format `version`) of the kept analysis `key`."""
    import hashlib

    return hashlib.sha256(f"{key}|{name}|{version}".encode()).hexdigest()[:24]


def _analysis_key(t, step_regex: str | None, rules: str | Path | None, memory: Retention, reader,
                  strict: bool = False) -> str | None:
    """The key of `t`'s analysis under these options, or None when it is not kept (not a
    one-shot run, or the frames not cached)."""
    import hashlib

    import polars as pl

    if not memory.one_shot or t.cache_dir is None:
        return None
    try:
        user_rules = None if rules is None else (str(Path(rules).resolve()), Path(rules).read_bytes())
        bundled = _bundled_rules_digest()
    except OSError:  # a rules file that cannot be read (a zipped install): nothing is kept
        return None
    rules_part = "-" if user_rules is None else user_rules[0] + "|" + hashlib.sha256(user_rules[1]).hexdigest()
    from stepscope import __version__

    raw = "|".join([str(ANALYSIS_FORMAT), __version__, bundled, pl.__version__, t.cache_dir.name, str(t.path),
                    repr(step_regex), rules_part, str(bool(strict)), repr(memory), type(reader).__name__])
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _keep_analysis(t, inv, key: str) -> bool:
    from stepscope.analysis.inventory import LATE_FIELDS
    from stepscope.ingest.cache import store_derived

    n = len(t.warnings)
    if inv.warnings[:n] != list(t.warnings):
        return False  # the inventory's warnings must be the trace's then its own, to be composed again
    # the per-event frames with their columns alone beside them: a one-shot document never reads them
    empty = {f"{f}_empty": getattr(inv, f).clear() for f in LATE_FIELDS}
    from stepscope.analysis.notes import as_data

    return store_derived(t.cache_dir, "analysis", key, inv.frames() | empty,
                         {"warnings": as_data(inv.warnings[n:])}) is not None


def _diagnosed(inv, key: str | None, calibration):
    """diagnose(inv), its calibration-free frames kept beside the analysis `key` names (one-shot
    runs: the per-gap frame stands as its longest gaps, as Diagnosis.drop_event_frames leaves it)."""
    from stepscope.analysis.diagnosis import CALIBRATION_FREE, calibration_free, diagnose
    from stepscope.ingest.cache import load_derived, store_derived

    entry = inv.trace.cache_dir
    dkey = _entry_key(key, "diagnosis", DIAGNOSIS_FORMAT) if key is not None else None
    got = load_derived(entry, "diagnosis", dkey) if key is not None else None
    if got is not None and set(got[0]) == set(CALIBRATION_FREE):
        return diagnose(inv, calibration, known=got[0])
    inv.read_events()  # restored without its activities (events=False): the diagnosis reads them
    known = calibration_free(inv) if key is not None else None
    d = diagnose(inv, calibration, known=known)
    if key is not None:
        c = d.collectives
        kept = {"gaps": d.gaps.clear(), "top_gaps": d.top_gaps(), "collective_ranks": c.ranks,
                "collective_kernels": c.kernels, "collective_steps": c.steps, "collective_work": c.work,
                "untraced_replay": known["untraced_replay"], "replay_figures": known["replay_figures"]}
        kept |= {f: getattr(d, f) for f in CALIBRATION_FREE if f not in kept}
        store_derived(entry, "diagnosis", dkey, kept, {})
    return d


def step_texts(inv):
    """render.json.inventory_texts(inv) (every step), kept beside the analysis inv.kept names and
    read back from there on the next run; None when the analysis is not kept. The text is a
    pure function of the kept frames and the code (TEXTS_FORMAT and the analysis' key), and building it is ~60 ms of
    a 0.7 s warm run on a million kernels against ~15 ms to read it."""
    if inv.kept is None:
        return None
    from stepscope.ingest.cache import load_derived, store_derived
    from stepscope.render.json import inventory_texts

    entry = inv.trace.cache_dir
    key = _entry_key(inv.kept, "texts", TEXTS_FORMAT)
    got = load_derived(entry, "texts", key)
    if got is not None and set(got[0]) == {"texts"}:
        return got[0]["texts"]
    texts = inventory_texts(inv)
    store_derived(entry, "texts", key, {"texts": texts}, {})
    return texts


def diagnosis(trace: str | Path | None = None, step_regex: str | None = None, rules: str | Path | None = None, *,
              cache: bool = True, launch_config: bool = False, memory: Retention = NOTEBOOK, steps: str | None = None,
              calibration=None, strict: bool = False, events: bool = True, window_steps: int | None = 0,
              scheduler: str | None = None, workers: int | None = None):
    """load(), then gaps, launch overhead, floors and verdicts (the Diagnosis), narrowed to the
    steps `steps` selects (Diagnosis.only_steps) after the analyses ran on the whole trace.
    `calibration`: the what-if's calibration (a file or a Calibration; None: the user's file,
    else the bundled one). `window_steps`: a long one-shot run is analyzed by windows of that many
    steps (by_windows.py; None: sized by the export; 0, the default: whole), on the dask cluster
    at `scheduler` or a local one of `workers` workers when given."""
    from stepscope.analysis.whatif import chosen

    check_steps(steps)
    if memory.one_shot and not launch_config and window_steps != 0 and trace is not None:
        from stepscope import by_windows

        d = by_windows.diagnosis(Path(trace), step_regex, rules, chosen(calibration), window_steps,
                                 scheduler=scheduler, workers=workers, cache=cache, strict=strict,
                                 code=_windows_code())
        if d is not None:
            return d.only_steps(steps)
    inv = load(trace, step_regex, rules, cache=cache, launch_config=launch_config, memory=memory, strict=strict,
               events=events)
    progress.stage(f"finding gaps, launch overhead and floors of {Path(inv.trace.path).name}")
    return _diagnosed(inv, inv.kept, chosen(calibration)).only_steps(steps)


def analyze(trace: str | Path | None = None, options=None, *, steps: str | None = "all", cache: bool = True,
            views: bool = False, events: bool = True, scheduler: str | None = None, workers: int | None = None):
    """`stepscope analyze TRACE`: the pipeline's chain (read, analyze) with the caches around it
    — the Parquet cache of the frames, the kept analysis and its per-step texts — into the
    pipeline's Result for the steps `steps` selects. `options`: pipeline.Options (None: its
    defaults). `views`: also each kind's StepDiagnosis (what the terminal prints); `events=False`:
    the per-event frames go once the Result is built, under a one-shot memory policy (the JSON
    document reads only the per-step results). `scheduler`/`workers`: a long run's windows are
    analyzed on that dask cluster (by_windows.py)."""
    from stepscope.pipeline import Options, result_of

    o = Options() if options is None else options
    check_steps(steps)  # a bad --steps fails before the trace is read
    d = diagnosis(trace, o.step_regex, o.rules, cache=cache, memory=o.memory, calibration=o.calibration,
                  strict=o.strict, events=events, window_steps=o.window_steps, scheduler=scheduler, workers=workers)
    result = result_of(d, steps, views=views)
    if events:
        return result
    from dataclasses import replace

    o.memory.results_ready(d)  # the document needs only the per-step results
    return replace(result, texts=step_texts(d.inv))


def _diagnosis_of(x, step_regex, rules, cache: bool, steps: str | None, memory: Retention = ONE_PASS,
                  calibration=None, strict: bool = False):
    """A trace given as a path, or as the Analysis open_trace returned. ONE_SHOT: only the
    per-step results are read after (the per-event frames go before the next trace is read)."""
    if hasattr(x, "diagnosis"):
        return x.diagnosis.only_steps(steps)
    d = diagnosis(x, step_regex, rules, cache=cache, steps=steps, memory=memory, calibration=calibration,
                  strict=strict, events=not memory.one_shot)
    memory.results_ready(d)
    return d


def _options(options, step_regex=None, rules=None, strict=False, calibration=None):
    """The pipeline.Options a command's library call runs under: `options`, or one made of the
    keyword arguments that stand for its fields (never both). Its `memory` is the command's own
    policy (analysis/memory.py: what the command reads after), not the Options'."""
    from stepscope.pipeline import Options

    if options is None:
        return Options(rules=rules, step_regex=step_regex, strict=strict, calibration=calibration)
    if step_regex is not None or rules is not None or strict or calibration is not None:
        raise TypeError("give the analysis options either as Options or as step_regex/rules/strict/calibration, "
                        "not both")
    return options


def compare(a, b, options=None, *, steps: str = "all", steps_b: str | None = None, step_regex: str | None = None,
            rules: str | Path | None = None, graph_gap_ns: float | None = None,
            graph_launch_ns: float | None = None, cache: bool = True, calibration=None,
            strict: bool = False) -> dict:
    """Two traces side by side (paths, or Analysis objects): the `compare --json` document.
    `options`: pipeline.Options (rules, step regex, strict, calibration), as analyze takes them;
    `step_regex`, `rules`, `strict` and `calibration` stand for its fields (the what-if's
    calibration: a file or a Calibration; None: the user's file, else the bundled one)."""
    from stepscope import options as opt

    o = _options(options, step_regex, rules, strict, calibration)
    step_regex, rules, strict, calibration = o.step_regex, o.rules, o.strict, o.calibration
    from stepscope.analysis.whatif import chosen

    check_steps(steps)
    check_steps(steps_b)
    opt.number(graph_gap_ns, "--graph-gap-ns", 0, opt.MAX_GRAPH_NS)
    opt.number(graph_launch_ns, "--graph-launch-ns", 0, opt.MAX_GRAPH_NS)
    return _compare(a, b, steps, steps_b, step_regex, rules, graph_gap_ns, graph_launch_ns, cache,
                    chosen(calibration), strict)


def _compare(a, b, steps, steps_b, step_regex, rules, graph_gap_ns, graph_launch_ns, cache, cal, strict) -> dict:
    from stepscope.analysis.whatif import GraphConstants

    consts = None
    if graph_gap_ns is not None or graph_launch_ns is not None:
        # constants given on the command line replace the point's (no range: one set of constants)
        p = cal.point()
        consts = GraphConstants(p.graph_launch_prep_ns,
                                graph_launch_ns if graph_launch_ns is not None else p.graph_launch_lead_ns,
                                graph_gap_ns if graph_gap_ns is not None else p.node_gap_ns,
                                p.memop_gap_ns, "given on the command line")
    # compare reads each side's per-step results only: one trace's events are gone before the other's are read
    da = _diagnosis_of(a, step_regex, rules, cache, steps, ONE_SHOT, cal, strict)
    db = _diagnosis_of(b, step_regex, rules, cache, steps if steps_b is None else steps_b, ONE_SHOT, cal, strict)
    return _compared(da, db, consts)


def _compared(da, db, consts=None) -> dict:
    """The compare document of two Diagnoses, its verdict sentence included."""
    from stepscope.analysis.compare import compare as compared
    from stepscope.render.sentences import compare_sentence, untraced_source, warning_texts

    doc = compared(da, db, consts)
    for tag, d in (("a", da), ("b", db)):
        if "untraced_source" in doc[tag]:
            doc[tag]["untraced_source"] = untraced_source(doc[tag]["untraced_source"], d.inv.trace.sidecar)
    doc["warnings"] = warning_texts(doc["warnings"])
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


def tp(trace=None, options=None, *, widths: str | Sequence[int] = TP_WIDTHS, kernels: int | None = None,
       launch_us: float | None = None, device_ms: float | None = None, collective_us: float | None = None,
       steps: str = "all", step_regex: str | None = None, rules: str | Path | None = None,
       cache: bool = True, calibration=None, strict: bool = False, expert_parallel: bool = False,
       model: str | None = None) -> dict:
    """Equation 1.3 per tensor-parallel width, from a trace (path or Analysis) or from numbers
    alone (kernels, launch_us, device_ms): the `tp --json` document. `calibration`: the what-if's
    calibration for the graph mode (a file or a Calibration; None: the user's file, else the
    bundled one). `expert_parallel` with `model` (an MoE card): the experts split across the GPUs
    instead of each one sharded. `options`: pipeline.Options, as compare takes them."""
    from stepscope import options as opt
    from stepscope.analysis import tp as tpm

    o = _options(options, step_regex, rules, strict, calibration)
    step_regex, rules, strict, calibration = o.step_regex, o.rules, o.strict, o.calibration
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
    ep = _expert_parallel(expert_parallel, model)
    d = _diagnosis_of(trace, step_regex, rules, cache, steps, calibration=calibration, strict=strict)
    proj = tpm.project_trace(d, ws, collective_us, expert_parallel=ep)
    doc = {"inputs": proj.inputs, "mode": proj.mode, "projection": proj.own.rows,
           "launch_bound_from_tp": proj.own.launch_bound_from_tp,
           "projections": {"eager": _mode(proj.eager), "graph": _mode(proj.graph)},
           "notes": [tp_note(n) for n in proj.notes]}
    ranks = tpm.rank_rows(d)
    if ranks:
        doc["ranks"] = ranks
    if d.inv.warnings:  # only when there are: the key is new (processes sharing a GPU, analysis/overlap.py)
        from stepscope.render.sentences import warning_texts

        doc["warnings"] = warning_texts(d.inv.warnings)
    # each TP step as the document gives it: its figures, then its verdict in words
    groups = [{k: g[k] for k in ("group", "ranks", "step_time_ns", "rank_skew_ns", "binding_rank")} | {"verdict": tp_sentence(g)} for g in tpm.tp_steps(d)]
    if groups:
        doc["tp_steps"] = groups
        skews = [g["rank_skew_ns"] for g in groups if g["rank_skew_ns"] is not None]
        doc["rank_skew_ns"] = max(skews) if skews else None
    return doc


def _expert_parallel(on: bool, model: str | None) -> dict | None:
    """{experts, top_k} of `model` for tp's expert-parallel projection (None when off)."""
    if not on:
        if model is not None:
            raise InputError("--model is read by tp with --expert-parallel only (the experts and top-k)")
        return None
    if model is None:
        raise InputError("--expert-parallel needs --model: the MoE card whose experts and top-k it splits")
    from stepscope.capture.models import load_card

    card = load_card(model)
    if not card.is_moe:
        raise InputError(f"--expert-parallel: {card.name} has no experts")
    return {"experts": card.experts, "top_k": card.experts_per_token}


def budget(trace, cells, *, model: str | None = None, batch: int | None = None, context: int | None = None,
           phase: str | None = None, steps: str | None = None) -> dict:
    """One step's HBM byte budget (the first step `steps` selects): each kernel joined to a
    measured cell of `cells`, next to the theoretical minimum and the bandwidth floor — the
    `budget --json` document. Model, phase, batch and context default to what the step's name
    (and the capture's sidecar) record."""
    import polars as pl

    from stepscope import options as opt
    from stepscope.analysis.steps import budget_shape
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
    inv = (trace.inventory if hasattr(trace, "inventory")  # an Analysis
           else load(trace, memory=ONE_PASS))  # the step's grid/block, the join to cells: Inventory.step_acts
    if inv.steps.height == 0:
        raise InputError(f"{trace}: no steps found")
    picked = parse_steps(steps, inv.steps)
    sid = picked[0]
    if steps not in (None, "") and len(picked) > 1:
        progress.notice(f"budget of step {sid}, the first of the {len(picked)} steps selected")
    fig = inv.steps.filter(pl.col("step") == sid).row(0, named=True)
    shape, lacking = budget_shape(fig, inv.trace.sidecar, {"model": model, "phase": phase, "batch": batch,
                                                             "context": context})
    if lacking:
        raise InputError(f"the step's name does not record {', '.join('--' + k for k in lacking)}: pass them")
    model, phase, batch, context = shape["model"], shape["phase"], shape["batch"], shape["context"]
    # a step name's shapes are the trace's word, not checked options: bounded like --batch and
    # --context (a name saying batch=10^18 overflowed the budget's 128-bit integers)
    for flag, v, most in (("--batch", batch, opt.MAX_BATCH), ("--context", context, opt.MAX_CONTEXT)):
        if isinstance(v, int) and not 1 <= v <= most:
            raise InputError(f"the step's name says {flag[2:]}={v}, outside 1..{most:,}: pass {flag} to budget it")
    if isinstance(shape.get("tp"), int) and not 1 <= shape["tp"] <= opt.MAX_WIDTH:
        raise InputError(f"the step's name says tp={shape['tp']}, outside 1..{opt.MAX_WIDTH:,}: not a width "
                         "stepscope can budget")
    gpu_name, peak = _gpu_peak(inv)
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.render.headline import step_rows
    from stepscope.analysis.step_view import step_diagnosis

    # the verdict block analyze opens with, so the budget is read beside the step's verdict
    from stepscope.pipeline import whatif_of

    d = diagnose(inv)
    block = [{"label": k, "text": v} for k, v in step_rows(step_diagnosis(d, sid, whatif=whatif_of(d)))]
    progress.stage(f"joining step {sid}'s kernels to {cells_path.name}")
    sk = step_kernels_from_inventory(inv, sid, memops=True)
    width = shape["tp"]
    if is_step_cells(table):  # the step's own kernels, measured one by one in launch order
        res = budget_order(step_sequence_from_inventory(inv, sid), table, model, int(batch), int(context),
                           str(phase), gpu_name, peak, tp=width, memops=sk)
    else:
        res = budgeted(sk, table, model, int(batch), int(context), str(phase), gpu_name, peak, tp=width)
    doc = {"trace": shown(Path(trace) if isinstance(trace, (str, Path)) else Path(inv.trace.path)), "cells": shown(cells_path), "step_index": sid, "model": model,
           **res.to_dict()}
    doc["step"] = {**res.step, "model": model}
    doc["verdict_block"] = block
    return doc


def _gpu_peak(inv) -> tuple[str | None, float | None]:
    """The trace's first GPU's name and memory bandwidth (bytes/s): the budget's bandwidth floor."""
    gpus = inv.trace.gpus
    gpu_name = gpus["name"][0] if gpus.height else None
    peak = float(gpus["memory_bandwidth_bps"][0]) if gpus.height and gpus["memory_bandwidth_bps"][0] else None
    return gpu_name, peak


def _report_budget(inv, sid: int, figures: dict, cells, given: dict | None) -> tuple:
    """The report's byte budget of step `sid` (its kernels joined to the cells of `cells` by
    class): (BudgetResult, ()), (None, the shape figures lacking), or (None, ()) without cells.
    Model, phase, batch and context: `given` (report's --model etc.), else the step's recorded
    name (`figures`), else the capture's sidecar, as `budget` reads them (steps.budget_shape)."""
    if cells is None:
        return None, ()
    from stepscope.analysis.steps import budget_shape
    from stepscope.bytes.budget import budget as budgeted
    from stepscope.bytes.budget import step_kernels_from_inventory
    from stepscope.bytes.cells import read_cells

    table = read_cells(cells)
    shape, lacking = budget_shape(figures, inv.trace.sidecar, given)
    if lacking:
        return None, tuple(lacking)
    gpu_name, peak = _gpu_peak(inv)
    return budgeted(step_kernels_from_inventory(inv, sid), table, shape["model"], int(shape["batch"]),
                    int(shape["context"]), str(shape["phase"]), gpu_name, peak, tp=shape["tp"]), ()


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

    def __repr__(self) -> str:
        # short: the content (a whole HTML page, an export) is one attribute away
        where = str(self.path) if self.path is not None else "not written"
        what = f", {self.activities:,} GPU activities" if self.activities is not None else ""
        size = f", {len(self._content):,} characters" if self._content is not None else ""
        return f"Written({where}, steps {list(self.steps)}{what}{size})"

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


def report(trace, output: str | Path | None = None, options=None, *, format: str | None = None, compare=None,
           cells=None, steps: str | None = None, compare_steps: str | None = None,
           step_regex: str | None = None, rules: str | Path | None = None, model: str | None = None,
           batch: int | None = None, context: int | None = None, phase: str | None = None,
           calibration=None, force: bool = False, strict: bool = False) -> Written:
    """One step's report — timeline, classes, gaps, floors, verdict; with `compare`, a second
    trace's step beside it; with `cells`, the byte budget — as HTML or Markdown: `format`, else
    the extension of `output` picks it (render/report_data.RENDERERS; HTML for `-`, stdout).
    Written to `output` (all or nothing; `force`: even over a read-only file) when given.
    `trace` and `compare`: paths or Analysis objects; model, batch, context and phase: the byte
    budget's shape, as `budget` takes it (default: the step's name, then the capture's sidecar).
    `options`: pipeline.Options, as compare takes them."""
    from stepscope import options as opt
    import polars as pl

    o = _options(options, step_regex, rules, strict, calibration)
    step_regex, rules, strict, calibration = o.step_regex, o.rules, o.strict, o.calibration
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.paths import refuse_overwrite
    from stepscope.render.output import is_stdout, target, write_atomic
    from stepscope.analysis.representative import pick_step
    from stepscope.render.report_data import ReportView, budget_for, chosen, renderer, step_view

    suffix = ".html" if output is None or is_stdout(output) else Path(output).suffix
    render = renderer(format or suffix, output)
    check_steps(steps)  # a bad selection fails before any trace is read
    check_steps(compare_steps)
    opt.integer(batch, "--batch", 1, opt.MAX_BATCH)
    opt.integer(context, "--context", 1, opt.MAX_CONTEXT)
    shape = {"model": model, "batch": batch, "context": context, "phase": phase}
    if output is not None and not is_stdout(output):
        target(output, force)  # a device, FIFO or read-only file fails before the trace is read
        refuse_overwrite(Path(output), [Path(p) for p in (trace, compare, cells, rules) if isinstance(p, (str, Path))])

    from stepscope.analysis import whatif
    from stepscope.pipeline import whatif_of

    cal = None

    def view(x, which):
        nonlocal cal
        if hasattr(x, "diagnosis"):  # an Analysis
            inv, d = x.inventory, x.diagnosis
        else:
            inv = load(x, step_regex, rules, memory=ONE_PASS, strict=strict)  # the budget's grid/block: Inventory.step_acts
            progress.stage(f"finding gaps, launch overhead and floors of {Path(x).name}")
            cal = whatif.chosen(calibration) if cal is None else cal  # read once, after the first trace
            d = diagnose(inv, cal)  # once: the picked step, its floors and its TP peers all read it
        return inv, d, step_view(inv, pick_step(inv, which, d), d, chosen=chosen(inv, which), whatif=whatif_of(d))

    inv, d, first = view(trace, steps)
    other = comparison = runs = None
    if compare is not None:
        from stepscope.analysis.run_compare import compare_runs
        from stepscope.analysis.whatif import is_graph_trace

        inv_b, db, other = view(compare, compare_steps)
        comparison = _compared(d.only_steps(steps), db.only_steps(compare_steps))
        ga = is_graph_trace(inv)
        runs = compare_runs(d, db, ga, is_graph_trace(inv_b), None if ga else d.graph_prediction)
    budget_rows, note = budget_for(*_report_budget(inv, first.step, first.figures, cells, shape))
    from stepscope.analysis.run import run_view

    run = run_view(d)
    run_steps = () if run is None else tuple(inv.steps.select(
        pl.col("step").alias("index"), pl.col("step_begin").alias("begin_ns"), "step_time_ns", "phase").to_dicts())
    if output is not None:
        progress.stage(f"writing {Path(output).name}")
    text = render(ReportView(first, other, budget_rows, note, run=run, run_steps=run_steps, comparison=comparison,
                             runs=runs))
    if output is not None:
        write_atomic(output if is_stdout(output) else Path(output), text, force)
    return Written(text, None if output is None else Path(output),
                   (first.step,) + ((other.step,) if other is not None else ()))


def export(trace, output: str | Path | None = None, options=None, *, steps: str = "all",
           step_regex: str | None = None, rules: str | Path | None = None, force: bool = False,
           strict: bool = False) -> Written:
    """Chosen steps as Chrome-trace JSON for ui.perfetto.dev (render/perfetto.py), gzipped when
    `output` ends in .gz; written to `output` (all or nothing; `-`: stdout; `force`: even over a
    read-only file) when given. `options`: pipeline.Options, as compare takes them (an export
    draws no what-if: its calibration is not read)."""
    import polars as pl

    o = _options(options, step_regex, rules, strict)
    step_regex, rules, strict = o.step_regex, o.rules, o.strict

    from stepscope.paths import refuse_overwrite
    from stepscope.render.output import is_stdout, target, write_atomic_with
    from stepscope.render.perfetto import export_chunks, write_export

    if output is not None and not is_stdout(output):
        target(output, force)  # a device, FIFO or read-only file fails before the trace is read
        refuse_overwrite(Path(output), [Path(p) for p in (trace, rules) if isinstance(p, (str, Path))])
    check_steps(steps)  # a bad selection fails before the trace is read
    inv = (trace.inventory if hasattr(trace, "inventory")  # an Analysis
           else load(trace, step_regex, rules, memory=EXPORT, strict=strict))  # grid/block: read while writing (render/perfetto.py)
    ids = parse_steps(steps, inv.steps)
    progress.stage(f"writing {len(ids)} step(s)" + (f" to {Path(output).name}" if output is not None else ""))
    n = inv.acts.select(pl.col("step").is_in([int(i) for i in ids]).sum()).item()
    if output is None:
        return Written("".join(export_chunks(inv, ids)), None, tuple(ids), n, True)
    gz = not is_stdout(output) and Path(output).suffix.lower() == ".gz"
    write_atomic_with(output if is_stdout(output) else Path(output),
                      lambda tmp: write_export(inv, ids, tmp, gz), force)
    return Written(None, Path(output), tuple(ids), n, True)


def calibrate(traces: Sequence[str | Path], output: str | Path | None = None, *, step_regex: str | None = None,
              rules: str | Path | None = None, cache: bool = True, strict: bool = False):
    """The what-if constants measured on graph captures (analysis/whatif.measure), one capture per
    trace that replays a CUDA graph: a Calibration, written as JSON to `output` when given. An
    eager trace whose file name is a graph capture's with `graph` replaced by `eager` is its twin
    (whatif.with_twin); any other trace without a replay is named in the notes. No graph capture
    at all is an InputError."""
    from stepscope.analysis.diagnosis import diagnose
    from dataclasses import replace

    from stepscope.analysis.whatif import Calibration, GraphConstants, held_out_error, measure, with_twin
    from stepscope.paths import input_file, shown
    from stepscope.render.output import write_atomic

    if not traces:
        raise InputError("calibrate needs at least one graph capture (an nsys export of CUDA-graph steps)")
    paths = [input_file(t, "a graph capture (nsys SQLite export)") for t in traces]
    caps, eager, notes = [], {}, []
    for t in paths:
        progress.stage(f"measuring {t.name}")
        # the floors and prologues the constants are measured on need no calibration
        d = diagnose(load(t, step_regex, rules, cache=cache, memory=ONE_PASS, strict=strict), GraphConstants(0, 0, 0, 0))
        c = measure(d.inv, shown(t), d.prologue, d.floors)
        if c is None:
            eager[t.resolve()] = (t, d)
        else:
            caps.append((t, c))
    out, twins = [], []
    for t, c in caps:
        twin = eager.pop(t.with_name(t.name.replace("graph", "eager")).resolve(), None) if "graph" in t.name else None
        out.append(with_twin(c, twin[1], shown(twin[0])) if twin else c)
        twins.append(twin[1] if twin else None)
    if len(out) > 1:  # each twin predicted by the others: the spread of held-out errors sets the range
        whole = Calibration(tuple(out))
        out = [c if d is None else replace(c, loo_error=round(held_out_error(whole, c, d), 5))
               for c, d in zip(out, twins)]
    notes += [f"{shown(t)}: no CUDA-graph replay (captured with --cuda-graph-trace=node?) and no graph "
              "capture named like it: not used" for t, _ in eager.values()]
    if not out:
        raise InputError("none of the traces replays a CUDA graph with per-node rows: give graph captures "
                         "made with nsys --cuda-graph-trace=node")
    cal = Calibration(tuple(out), "calibrate" if output is None else shown(output), tuple(notes))
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(output), cal.to_json())
    return cal


def report_result(path: str | Path, step_regex: str | None = None, rules: str | Path | None = None,
                  cache: bool = True, strict: bool = False):
    """Analyze one report of a run (what `stepscope analyze PATH` computes) and keep what the
    run needs: a reports.ReportResult."""
    import polars as pl

    from stepscope.analysis.collectives import other_activities, touching_steps
    from stepscope.analysis.whatif import scheduling
    from stepscope.ingest.session import session_clock
    from stepscope.paths import shown
    from stepscope.render.sentences import warning_texts
    from stepscope.reports import FLOOR_COLUMNS, STEP_COLUMNS, ReportResult

    d = diagnosis(path, step_regex, rules, cache=cache, memory=ONE_SHOT, strict=strict)
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
                       t.gpus.to_dicts(), warning_texts(inv.warnings), steps, inv.classes.clone(), inv.collectives.clone(),
                       touching, other, n_kernels, scheduling(inv))
    ONE_SHOT.results_ready(d)
    return out


def report_outcome(path: str, step_regex: str | None = None, rules: str | None = None,
                   cache: bool = True, strict: bool = False):
    """report_result, with any failure turned into a reports.ReportFailure naming the report:
    what a worker returns (an exception of polars' or ADBC's Rust code may not travel back whole)."""
    from stepscope.errors import StepscopeError
    from stepscope.paths import shown
    from stepscope.reports import ReportFailure

    try:
        return report_result(path, step_regex, rules, cache, strict)
    except StepscopeError as e:
        return ReportFailure(shown(path), str(e), e.exit_code)
    except MemoryError:
        return ReportFailure(shown(path), "ran out of memory analyzing it: give the worker more memory", 2)
    except Exception as e:  # noqa: BLE001 - a bug: one line, exit 3, as the CLI says of any other
        return ReportFailure(shown(path), f"internal error ({type(e).__name__}: {e})", 3)


def run(reports: Sequence[str | Path], *, step_regex: str | None = None, rules: str | Path | None = None,
        steps: str = "all", cache: bool = True, scheduler: str | None = None, workers: int | None = None,
        processes: bool = True, timeout: float | None = None, strict: bool = False, calibration=None):
    """Several reports of one run (files, directories of exports, glob patterns): each analyzed
    alone (stepscope/reports.py, on dask when it is installed: stepscope/distribute.py), then one
    run view (analysis/reports_run.py): the RunView, narrowed to the TP steps `steps` selects."""
    from stepscope.analysis.reports_run import combine, only_groups
    from stepscope.distribute import map_reports
    from stepscope import options as opt
    from stepscope.reports import expand_reports

    check_steps(steps)
    opt.integer(workers, "--workers", 1, opt.MAX_WORKERS)
    paths = expand_reports(list(reports))
    results = map_reports(paths, report_outcome, step_regex, None if rules is None else str(rules), cache,
                          strict, scheduler=scheduler, workers=workers, processes=processes, timeout=timeout)
    progress.stage(f"matching the collectives of {len(results)} reports")
    view = combine(results, calibration)
    if steps not in (None, "", "all"):
        groups = sorted(set(view.steps["group"].drop_nulls().to_list()))
        view = only_groups(view, parse_steps(steps, groups))
    return view


def run_document(reports: Sequence[str | Path], **kw) -> dict:
    """The `analyze --json R1 R2 …` document of several reports (render/reports_run.py)."""
    from stepscope.render.reports_run import run_dict

    return run_dict(run(reports, **kw))


def check_cluster(scheduler: str | None, workers: int | None) -> None:
    """--scheduler and --workers as `analyze` takes them, checked before any trace is read: a
    scheduler that is not an address, a worker count out of range, one line each (InputError)."""
    from stepscope import options as opt
    from stepscope import scheduler_address

    opt.integer(workers, "--workers", 1, opt.MAX_WORKERS)
    if scheduler is not None:
        scheduler_address.check(scheduler)
