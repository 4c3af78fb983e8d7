"""The layers of the package (issue 22): analyses below renderers below commands, no import
cycle. Read from the source with ast, so a lazy import inside a function counts too where the
rule is about layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "stepscope"


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """The stepscope modules a file imports (`from stepscope.x import y` counts y when it is a
    module); top_level_only: only the statements run when the module is imported."""
    tree = ast.parse(path.read_text())
    nodes = []
    if top_level_only:
        todo = list(tree.body)
        while todo:  # module level, including the bodies of if/try at module level
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            nodes.append(n)
            todo.extend(c for c in ast.iter_child_nodes(n) if isinstance(c, ast.stmt))
    else:
        nodes = list(ast.walk(tree))
    me = _module(path)
    out = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("stepscope")}
        elif isinstance(n, ast.ImportFrom):
            if n.level:  # relative
                base = me.split(".")[: len(me.split(".")) - n.level + (path.name == "__init__.py")]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            if not mod.startswith("stepscope"):
                continue
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in n.names if f"{mod}.{a.name}" in MODULES}
    return {m for m in out if m in MODULES and m != me}


def test_the_reader_sees_the_package():
    assert {"stepscope.cli", "stepscope.commands.app", "stepscope.analysis.verdict", "stepscope.library"} <= set(MODULES)
    assert "stepscope.analysis.verdict" in _imports(MODULES["stepscope.analysis.diagnosis"], True)


def _no_cycle(graph: dict[str, set[str]]) -> None:
    """Fail naming the first import cycle of `graph` (module -> the modules it imports), depth first."""
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_import_cycle():
    graph = {m: _imports(p, True) for m, p in MODULES.items()}
    _no_cycle(graph)


@pytest.mark.parametrize("layer, forbidden", [
    ("stepscope.analysis", ("stepscope.render", "stepscope.commands", "stepscope.cli", "stepscope.library",
                            "stepscope.api", "stepscope.pipeline")),
    ("stepscope.ingest", ("stepscope.render", "stepscope.commands", "stepscope.cli", "stepscope.library",
                          "stepscope.api", "stepscope.analysis", "stepscope.pipeline")),
    ("stepscope.render", ("stepscope.commands", "stepscope.cli", "stepscope.library", "stepscope.pipeline")),
    ("stepscope.pipeline", ("stepscope.commands", "stepscope.cli", "stepscope.library", "stepscope.api")),
    ("stepscope.library", ("stepscope.commands", "stepscope.cli")),
    ("stepscope.api", ("stepscope.commands", "stepscope.cli")),
    ("stepscope.commands", ("stepscope.cli",)),
])
def test_a_layer_imports_nothing_above_it(layer, forbidden):
    bad = [(m, i) for m, p in MODULES.items() if m == layer or m.startswith(layer + ".")
           for i in _imports(p, False) if any(i == f or i.startswith(f + ".") for f in forbidden)]
    assert not bad


def test_the_app_module_is_a_leaf():
    """commands/app.py holds the app and the shared options; commands/__init__.py lists every
    command (COMMANDS, GROUPS) and cli.py registers them: app imports no command module, and no
    command module registers itself (no `@app.command`, no `app.add_typer`)."""
    assert not {i for i in _imports(MODULES["stepscope.commands.app"], False) if i.startswith("stepscope.commands")}
    cli = _imports(MODULES["stepscope.cli"], True)
    assert {"stepscope.commands", "stepscope.commands.app"} <= cli
    for m, p in MODULES.items():
        if m.startswith("stepscope.commands.") and m != "stepscope.commands.app":
            text = p.read_text()
            assert "@app." not in text and "app.add_typer" not in text, m


def test_every_command_is_listed_once_in_help_order():
    """The commands `stepscope --help` lists are COMMANDS then GROUPS, in that order: each a
    function of a command module."""
    from typer.main import get_command

    from stepscope.cli import app
    from stepscope.commands import COMMANDS, GROUPS

    names = [n for n, _ in COMMANDS] + [n for n, _ in GROUPS]
    assert len(set(names)) == len(names)
    assert list(get_command(app).commands) == names


# the analyses a renderer must not run: it formats the Result (stepscope/pipeline.py) it is
# given. Types, constants and pure lookups of these layers (Inventory, KINDS, FAMILY_LABELS, the
# representative step's grouping) stay importable.
COMPUTATIONS = {
    "stepscope.analysis.run": {"run_view"}, "stepscope.analysis.whatif": {"describe_for"},
    "stepscope.analysis.diagnosis": {"diagnose"}, "stepscope.analysis.collectives": {"collectives", "summary_rank"},
    "stepscope.bytes.budget": {"budget"}, "stepscope.bytes.cells": {"read_cells"},
    "stepscope.analysis.inventory": {"analyze_trace"},
    "stepscope.analysis.reports_run": {"combine", "rank_totals", "tp_groups", "run_binding_rank", "rank_medians",
                                       "report_ranks"},
}


def test_renderers_run_no_analysis():
    """render/ formats what the Result holds (issue 43): no renderer imports the run view, the
    what-if calibration's description, the diagnosis, the collectives, the byte budget or the
    cells reader, at module level or inside a function."""
    bad = []
    for m, p in MODULES.items():
        if not m.startswith("stepscope.render"):
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module in COMPUTATIONS:
                names = {a.name for a in n.names}
                if COMPUTATIONS[n.module] & names:
                    bad.append((m, n.module, n.lineno))
    assert not bad


def test_no_module_state_of_the_analysis_options():
    """The calibration and --strict travel as arguments (pipeline.Options): no module-global
    calibration in whatif.py, no context variable anywhere in the package."""
    import stepscope.analysis.whatif as whatif

    assert not hasattr(whatif, "_CHOSEN") and not hasattr(whatif, "calibrated")
    for m, p in MODULES.items():
        assert "contextvars" not in p.read_text(), m


def test_no_import_cycle_anywhere_even_through_lazy_imports():
    """No circle through imports inside functions either, in the whole package (the two that
    were: library -> distribute -> reports -> library, capture/engines/vllm_engine <->
    vllm_serving). A package's `__init__` imports its modules lazily where it must; a module
    importing its own package (`from stepscope.ingest import x`) counts as importing it."""
    graph = {m: _imports(p, False) for m, p in MODULES.items()}
    _no_cycle(graph)


def test_analyses_write_no_json_or_text_documents():
    """JSON is built in render/ only: no analysis imports json or stepscope.jsontext."""
    bad = []
    for m, p in MODULES.items():
        if m.startswith("stepscope.analysis"):
            tree = ast.parse(p.read_text())
            for n in ast.walk(tree):
                names = ([a.name for a in n.names] if isinstance(n, ast.Import) else
                         [n.module or ""] + [f"{n.module}.{a.name}" for a in n.names] if isinstance(n, ast.ImportFrom)
                         else [])
                bad += [(m, x) for x in names if x in ("json", "stepscope.jsontext")]
    assert not bad


def test_analyses_build_no_sentences():
    """Words are render/'s: no analysis formats a figure with its unit (an f-string holding
    `ms`, `µs` or `GB` after a formatted value), as the TP verdict, the TP projection's notes and
    the untraced estimate's source once did (render/sentences.py builds them now)."""
    import re

    unit = re.compile(r"\{[^{}]*\}\s*(ms|µs|us|GB|MB|KiB)\b")
    bad = []
    for m, p in MODULES.items():
        if m.startswith("stepscope.analysis"):
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, ast.JoinedStr):
                    text = ast.unparse(n)
                    if unit.search(text):
                        bad.append((m, n.lineno, text))
    assert not bad


def test_report_renderers_read_only_the_view():
    """The HTML and Markdown reports read their StepView (frozen, built once by
    report_data.step_view), never the Inventory behind it: no `.inv` anywhere in them."""
    import dataclasses

    from stepscope.render.report_data import ReportView, StepView

    for m in ("stepscope.render.html", "stepscope.render.markdown"):
        tree = ast.parse(MODULES[m].read_text())
        touched = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "inv"]
        assert not touched, (m, touched)
        assert "stepscope.analysis.inventory" not in _imports(MODULES[m], False)
    for cls in (StepView, ReportView):
        assert cls.__dataclass_params__.frozen
    assert "inv" not in {f.name for f in dataclasses.fields(StepView)}


def test_report_renderers_import_no_polars():
    """The HTML and Markdown reports draw plain rows (issue 22): StepView and ReportView hold
    tuples of dicts where they held frames (report_data.step_view converts each frame once), and
    neither renderer imports polars, at module level or inside a function."""
    import dataclasses

    from stepscope.render.report_data import ReportView, StepView

    for m in ("stepscope.render.html", "stepscope.render.markdown"):
        tree = ast.parse(MODULES[m].read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [x for x in names if x == "polars" or x.startswith("polars.")], m
    for cls in (StepView, ReportView):
        frames = [f.name for f in dataclasses.fields(cls) if "pl." in str(f.type) or "DataFrame" in str(f.type)]
        assert not frames, (cls.__name__, frames)


def test_no_import_cycle_even_through_lazy_imports():
    """Within the data path's layers (ingest, analysis, bytes, render) a module's imports
    inside functions count too: ingest/__init__ imports its readers lazily, and a reader that imported the package back (`from stepscope.ingest import sanity`)
    closed a circle (ingest -> kineto -> ingest)."""
    layers = ("stepscope.ingest", "stepscope.analysis", "stepscope.render", "stepscope.bytes")
    inside = {m: p for m, p in MODULES.items() if m.startswith(layers)}
    graph = {m: {n for n in _imports(p, False) if n in inside} for m, p in inside.items()}
    _no_cycle(graph)


def test_packed_keys_of_the_analyses_only_through_frames():
    """A key packed by hand (`1 << bits`) in an analysis repeats frames.py's range checks, and
    drifts from them: analysis/ shifts bits only in frames.py."""
    bad = [m for m, p in MODULES.items() if m.startswith("stepscope.analysis.") and m != "stepscope.analysis.frames"
           for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.LShift)]
    assert not bad



# the frame methods that derive a figure (a sum by group, a running value, a median) and the
# Inventory/Diagnosis derivations that join or rank frames: a renderer calls none of them, it
# formats the Result's values (analysis/step_view.py builds the terminal's and the reports'
# step views below render/)
DERIVING = {"group_by", "agg", "over", "cum_sum", "cum_max", "median", "mean", "quantile", "value_counts",
            "rolling", "pivot", "kernels_with_evidence", "top_gaps"}
# where render/ still calls one, and why: perfetto lays slices out in lanes (where each slice is
# drawn, no figure of the trace), sections encodes the Diagnosis' longest gaps column-wise as JSON
# text; NOT_YET_MOVED would list frame work still to move below render/ (none is left)
LAYOUT = {"stepscope.render.perfetto": {"group_by", "len", "over", "cum_sum", "cum_max"},
          "stepscope.render.sections": {"top_gaps"}}
NOT_YET_MOVED: dict[str, set[str]] = {}


def test_renderers_derive_no_figure_from_frames():
    """No module of render/ groups, aggregates or runs a derivation of the Inventory or the
    Diagnosis (a string's `.join` is words, not frames), beyond LAYOUT and NOT_YET_MOVED; the
    terminal, the verdict block and the report renderers import no polars at all."""
    bad = []
    for m, p in MODULES.items():
        if not m.startswith("stepscope.render"):
            continue
        allowed = LAYOUT.get(m, set()) | NOT_YET_MOVED.get(m, set())
        for n in ast.walk(ast.parse(p.read_text())):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in DERIVING
                    and not isinstance(n.func.value, ast.Constant) and n.func.attr not in allowed):
                bad.append((m, n.func.attr, n.lineno))
    assert not bad
    for m in ("stepscope.render.terminal", "stepscope.render.headline", "stepscope.render.html",
              "stepscope.render.markdown"):
        tree = ast.parse(MODULES[m].read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [x for x in names if x == "polars" or x.startswith("polars.")], m


def test_the_step_views_are_built_below_render():
    """The terminal's step view, class breakdown and head line are analysis/step_view.py's, built
    by pipeline.result_of: no renderer defines or builds them."""
    for m, p in MODULES.items():
        if m.startswith("stepscope.render"):
            tree = ast.parse(p.read_text())
            defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert not defined & {"step_diagnosis", "kind_figures", "head_figures", "StepDiagnosis"}, m
    assert "stepscope.render.views" not in MODULES
    for m in ("stepscope.render.terminal", "stepscope.render.headline"):
        called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
                  for n in ast.walk(ast.parse(MODULES[m].read_text())) if isinstance(n, ast.Call)}
        assert not called & {"step_diagnosis", "kind_figures", "head_figures", "step_kinds"}, m


def test_no_frame_is_read_on_an_attribute_access():
    """What is read is decided up front (library.load's `events`, read_trace's `events`) and read
    by an explicit call (Trace.read_events, Inventory.read_events): the Trace's and the
    Inventory's `__getattr__` call nothing but the AttributeError they raise (and the lookups
    that word it). (The package's lazy imports, stepscope/__init__ and lazy_numpy, read no file.)"""
    bad = []
    for m in ("stepscope.model", "stepscope.analysis.inventory"):
        p = MODULES[m]
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.FunctionDef) and n.name == "__getattr__":
                for c in ast.walk(n):
                    if isinstance(c, ast.Call):
                        f = c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", None)
                        if f not in ("AttributeError", "get", "type"):
                            bad.append((m, n.lineno, f))
    assert not bad


# the analyses' warnings still written as sentences: none (the readers' own, about the file, are
# ingest/'s and stay sentences)
SENTENCE_WARNINGS: dict[str, int] = {}


def test_analyses_warn_with_notes_not_sentences():
    """An analysis appends a Note (a code and its fields, analysis/notes.py), worded by
    render/sentences.py's WARNING_WORDS: no `warnings.append(<text>)` in analysis/ beyond
    SENTENCE_WARNINGS, and every code has its words."""
    from stepscope.analysis.notes import CODES
    from stepscope.render.sentences import WARNING_WORDS

    found = {}
    for m, p in MODULES.items():
        if not m.startswith("stepscope.analysis"):
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append"
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "warnings" and n.args
                    and not (isinstance(n.args[0], ast.Call) and getattr(n.args[0].func, "id", None) == "note")):
                found[m] = found.get(m, 0) + 1
    assert found == SENTENCE_WARNINGS
    assert set(WARNING_WORDS) == set(CODES)
