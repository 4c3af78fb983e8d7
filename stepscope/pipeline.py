"""The chain every analysis follows, as three calls with the values between them in sight:

    trace = read(path)                       # ingest/: a reader recognises the file, gives the one Trace model
    result = analyze(trace, Options(...))    # analysis/: pure functions over frames, into a frozen Result
    data = render(result, JsonRenderer())    # render/: formats what the Result holds, computes nothing

`Options` holds everything an analysis depends on besides the trace (rules, step regex, strict,
the what-if calibration, the memory policy): nothing is read from module state or a context
variable on the way. `library.analyze(path, options)` is the same chain with the caches around it
(ingest/cache.py's frames and kept analyses): what `stepscope analyze` runs, and the same Result.
docs/API.md shows it end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from stepscope.analysis.memory import NOTEBOOK, Retention


@dataclass(frozen=True)
class Options:
    """What an analysis depends on besides the trace.

    rules: a TOML file of extra classification rules (consulted first); step_regex: NVTX range
    names that delimit steps; strict: a step_regex that matches no range is an InputError, not a
    warning; calibration: the what-if's (a file, a whatif.Calibration or one GraphConstants;
    None: the user's file when it exists, else the bundled one); memory: what the analysis may
    let go of on the way (analysis/memory.py: NOTEBOOK keeps everything, ONE_SHOT what one
    document needs); window_steps: how many steps a window of a long one-shot run owns
    (by_windows.py; None: sized by the export, 0: the trace read whole)."""

    rules: str | Path | None = None
    step_regex: str | None = None
    strict: bool = False
    calibration: Any = None
    memory: Retention = NOTEBOOK
    window_steps: int | None = None


@dataclass(frozen=True)
class Result:
    """One trace analyzed: everything any renderer of `analyze` prints.

    diagnosis: the Diagnosis (its `inv`, the Inventory: steps, classes, kernels; gaps, launch,
    floors, verdicts, what-if); steps: the step ids selected; run: the run view of a trace of
    many steps (analysis/run.py; None under its minimum); whatif_calibration: the constants the
    median step's what-if used and their captures (None without a calibration); kinds: the
    selected steps by kind, each as (its representative step's row, the kind's step ids);
    views: each kind's representative step as analysis.step_view.StepDiagnosis (when asked for:
    the terminal's verdict and diagnosis), figures: its class breakdown (step_view.KindFigures)
    and head: the trace's kernels and steps (step_view.HeadFigures), both with the views; texts: each step's inventory part of the JSON document,
    when a kept analysis holds it (library.step_texts), else None."""

    diagnosis: Any
    steps: tuple[int, ...]
    run: dict | None
    whatif_calibration: dict | None
    kinds: tuple[tuple[dict, tuple[int, ...]], ...]
    views: Mapping[int, Any] = field(default_factory=dict)
    texts: Any = None
    figures: Mapping[int, Any] = field(default_factory=dict)
    head: Any = None

    @property
    def inventory(self):
        return self.diagnosis.inv


class Renderer(Protocol):
    """Formats a Result (or a report's view): bytes out, nothing computed."""

    def render(self, result) -> bytes: ...


def read(path: str | Path, *, cache: bool | None = False, launch_config: bool = False):
    """The one Trace model of an export (ingest.read_trace: the reader registry recognises the
    format from the file's first bytes). `cache=None` reads and writes the Parquet cache."""
    from stepscope.ingest import read_trace

    return read_trace(Path(path), cache=cache, launch_config=launch_config)


def analyze(trace, options: Options = Options(), steps: str | None = "all", *, views: bool = True) -> Result:
    """A Trace analyzed under `options`, nothing cached: the Inventory, the Diagnosis, the run
    view, the what-if's calibration and (`views`) each kind's step view, for the steps `steps`
    selects (stepscope.selection)."""
    from stepscope.analysis.classify import load_rules
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.analysis.whatif import chosen
    from stepscope.selection import check_steps

    check_steps(steps)
    # the analysis reads the trace's event frames: a trace an earlier analysis let go of them
    # (Options.memory) reads them again from its file here, before anything else
    trace.read_events()
    inv = analyze_trace(trace, options.step_regex, load_rules(options.rules), memory=options.memory,
                        strict=options.strict)
    return result_of(diagnose(inv, chosen(options.calibration)), steps, views=views)


def result_of(d, steps: str | None = "all", texts=None, *, views: bool = False) -> Result:
    """The Result of a Diagnosis `d` (every analysis of the trace done), for the steps `steps`
    selects: the run view, the what-if's calibration and the kinds of step computed here, once,
    so that no renderer computes them."""
    from stepscope.analysis.representative import step_kinds
    from stepscope.analysis.run import run_view
    from stepscope.selection import parse_steps

    inv = d.inv
    ids = steps if isinstance(steps, list) else parse_steps(steps, inv.steps)
    run = run_view(d)
    whatif = whatif_of(d)
    kinds = tuple((first, tuple(members)) for first, members in step_kinds(inv, ids))
    shown, figures, head = {}, {}, None
    if views:
        from stepscope.analysis.step_view import head_figures, kind_figures, step_diagnosis

        shown = {first["step"]: step_diagnosis(d, first["step"], whatif=whatif) for first, _ in kinds}
        figures = {first["step"]: kind_figures(inv, first["step"]) for first, _ in kinds}
        head = head_figures(inv)
    return Result(d, tuple(ids), run, whatif, kinds, shown, texts, figures, head)


def whatif_of(d) -> dict | None:
    """The constants a Diagnosis' median step's predicted_graph_step_* used, and the captures
    they come from (None when its calibration is one set of constants, or none)."""
    from stepscope.analysis.whatif import describe_for

    cal = getattr(d, "calibration", None)
    return describe_for(d.inv, cal, d.prologue) if cal is not None and hasattr(cal, "describe") else None


def render(result, renderer: Renderer) -> bytes:
    """`renderer`'s bytes of `result` (render/: JsonRenderer, TerminalRenderer, MarkdownRenderer,
    HtmlRenderer, PerfettoRenderer)."""
    return renderer.render(result)
