"""The chain of values (stepscope/pipeline.py, docs/API.md): read -> analyze(Options) -> render.

The documents it gives are checked against the golden JSON stored by tests/golden/regen.py (made
before the chain existed) and plain SQL over the same export; the options are checked to travel as
arguments (no state left behind by one analysis for the next)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from stepscope.errors import InputError
from stepscope.pipeline import Options, analyze, read, render
from stepscope.render.json import JsonRenderer
from tests.conftest import FIXTURES, ROOT, need, ro
from tests.golden.regen import canonical, golden_path, stored

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"


def _golden(path):
    return json.loads(golden_path(path).read_text(encoding="utf-8"))


def _doc(result) -> dict:
    return json.loads(render(result, JsonRenderer()))


@pytest.mark.parametrize("path", [EAGER, TP2, FIXTURES / "vllm" / "llama8b_decode_b8_graph.sqlite"],
                         ids=lambda p: p.stem)
def test_the_chain_gives_the_golden_document(path):
    """read -> analyze -> render(JsonRenderer) without any cache is `analyze --json --steps all`
    as stored before the chain was made explicit (the trace's path aside)."""
    doc = _doc(analyze(read(need(path)), Options()))
    assert stored(canonical(doc)) == _golden(path)
    n = ro(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert sum(s["n_kernels"] for s in doc["steps"]) <= n


def test_the_api_page_example_runs():
    """docs/API.md's example runs as written from the repository root, and prints the export's
    kernel count (plain SQL) and the golden document's step time."""
    page = (ROOT / "docs" / "API.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 1
    p = subprocess.run([sys.executable, "-c", blocks[0]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    n = ro(EAGER).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    gold = _golden(EAGER)["steps"][0]
    lines = p.stdout.splitlines()
    assert lines[0] == f"nsys-sqlite {n} kernels"
    assert lines[1] == f"step 0 {gold['floors']['verdict']}"
    assert lines[2] == f"{gold['n_kernels']} kernels in step 0, {gold['step_time_ns']} ns"
    assert lines[3].startswith("fixtures/llama8b_decode_b1_eager.sqlite  nsys ")


def test_options_carry_the_calibration_and_leave_nothing_behind():
    """A calibration given in Options changes this analysis' what-if only: the next analysis
    without one is the default's again (the golden document's), as no module state holds it."""
    from stepscope.analysis.whatif import Calibration, bundled

    trace = read(need(EAGER))
    full = bundled()
    one = Calibration(full.captures[-1:], "one capture")
    assert len(full.captures) > 1 and one.point() != full.point()
    gold = _golden(EAGER)
    before = _doc(analyze(trace, Options()))
    given = _doc(analyze(trace, Options(calibration=one)))
    after = _doc(analyze(trace, Options()))
    assert before["whatif_calibration"] == after["whatif_calibration"] == gold["whatif_calibration"]
    assert given["whatif_calibration"]["origin"] == "one capture"
    assert [c["source"] for c in given["whatif_calibration"]["captures"]] == [full.captures[-1].source]
    key = "predicted_graph_step_time_ns"
    assert before["steps"][0]["floors"][key] == after["steps"][0]["floors"][key] == gold["steps"][0]["floors"][key]
    assert given["steps"][0]["floors"][key] != gold["steps"][0]["floors"][key]


def test_strict_travels_in_options():
    trace = read(need(EAGER))
    lenient = analyze(trace, Options(step_regex="^no such range$"))
    from stepscope.render.sentences import warning_texts

    assert any("matched no NVTX range" in w for w in warning_texts(lenient.inventory.warnings))
    with pytest.raises(InputError, match=r"\(--strict\)"):
        analyze(trace, Options(step_regex="^no such range$", strict=True))
    assert analyze(trace, Options(step_regex="^no such range$")).inventory.warnings == lenient.inventory.warnings


def test_library_analyze_is_the_cli_document(tmp_path):
    """stepscope.analyze (the chain behind the caches) renders `stepscope analyze --json`'s bytes."""
    import stepscope
    from tests.conftest import CliRunner

    from stepscope.cli import app

    res = CliRunner().invoke(app, ["analyze", "--json", "--no-cache", str(need(TP2))])
    assert res.exit_code == 0
    r = stepscope.analyze(TP2, cache=False)
    assert render(r, JsonRenderer()).decode() + "\n" == res.stdout
    assert r.steps == tuple(s["index"] for s in _golden(TP2)["steps"])


def test_every_renderer_formats_the_result():
    """Each output format is one Renderer: the Perfetto export of a Result is export's document,
    the HTML and Markdown reports are report's content, the terminal's text is analyze's."""
    from stepscope import library
    from stepscope.cli import app
    from stepscope.render.html import HtmlRenderer
    from stepscope.render.markdown import MarkdownRenderer
    from stepscope.render.perfetto import PerfettoRenderer, export_document
    from stepscope.render.terminal import TerminalRenderer
    from tests.conftest import CliRunner

    result = analyze(read(need(EAGER)), Options())
    assert json.loads(render(result, PerfettoRenderer())) == export_document(result.inventory, list(result.steps))
    n = ro(EAGER).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    events = json.loads(render(result, PerfettoRenderer()))["traceEvents"]
    # one slice per kernel, its category its class (the step's, launch calls' and memops' apart)
    assert sum(1 for e in events if e.get("ph") == "X" and e.get("cat") not in ("step", "launch", "memops")) == n
    text = render(result, TerminalRenderer()).decode()
    cli = CliRunner().invoke(app, ["analyze", "--no-cache", str(EAGER)], env={"COLUMNS": "80"})
    assert text.splitlines()[1:] == cli.stdout.splitlines()[1:]  # the first line holds the path as given
    from stepscope.render import report_data

    for fmt, cls in (("html", HtmlRenderer), ("markdown", MarkdownRenderer)):
        written = library.report(EAGER, format=fmt)
        view = _report_view(EAGER)
        assert render(view, cls()) == written.content.encode()
        assert report_data.renderer(fmt)(view) == written.content


def _report_view(path):
    from stepscope import library
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.analysis.memory import ONE_PASS
    from stepscope.pipeline import whatif_of
    from stepscope.render.report_data import ReportView, chosen, pick_step, step_view

    inv = library.load(path, memory=ONE_PASS)
    d = diagnose(inv)
    first = step_view(inv, pick_step(inv, None, d), d, chosen=chosen(inv, None), whatif=whatif_of(d))
    return ReportView(first, None, None, None, run=None, run_steps=(), comparison=None, runs=None)


@pytest.mark.parametrize("path, fmt", [
    (FIXTURES / "llama8b_decode_b1_eager.sqlite", "nsys-sqlite"),
    (FIXTURES / "columnar" / "llama-3.2-1b_decode_b1_eager.arrow", "nsys-arrow"),
    (FIXTURES / "columnar" / "llama-3.2-1b_decode_b1_eager.parquetdir", "nsys-parquet"),
    (FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz", "kineto-json"),
    (FIXTURES / "serving" / "llama1b_serve_r16_graph_plain_bare.sqlite.gz", "gzip-sqlite"),
    (ROOT / "README.md", None),
], ids=lambda x: x if isinstance(x, str) or x is None else x.name)
def test_the_registry_picks_the_reader_from_the_first_bytes(path, fmt):
    from stepscope.ingest.readers import reader_for

    path = need(path)
    head = None if path.is_dir() else path.read_bytes()[:16]
    r = reader_for(path, head)
    assert (r.format if r is not None else None) == fmt


def test_a_long_document_is_written_a_few_steps_at_a_time_as_one():
    """JsonRenderer.write makes each piece's sections with it (a long run's sections are ~40 % of
    its text, never all held at once): the bytes of the document made whole, with pieces of 7
    steps of the serving run's 132 steps."""
    import io

    import stepscope
    from tests.conftest import SERVING, gunzipped

    r = stepscope.analyze(gunzipped(SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz"), cache=False)
    n = len(r.steps)
    assert n > 64 and r.diagnosis.engine is not None and r.diagnosis.engine.height  # written in pieces
    out = io.BytesIO()
    JsonRenderer().write(r, out, steps_at_a_time=7)
    assert out.getvalue() == render(r, JsonRenderer())
    assert [s["index"] for s in json.loads(out.getvalue())["steps"]] == list(r.steps)

