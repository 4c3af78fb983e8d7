"""The verdict block (render/headline.py) that every view of a step opens with: analyze on the
terminal, the HTML and Markdown reports, the compare report, budget. One source of the rows,
checked here once for every format; the figures against the --json documents (integer ns, a
different renderer), and the README's numbers of the bundled H200 traces."""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil

import pytest
from tests.conftest import CliRunner

from stepscope import library
from stepscope.cli import app
from tests.conftest import FIXTURES

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
VLLM = FIXTURES / "vllm" / "llama8b_decode_b1_eager.sqlite"
CELLS = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
TORCH = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _report(tmp_path, fmt: str, *args: str) -> str:
    out = tmp_path / f"r.{fmt}"
    r = CliRunner().invoke(app, ["report", *args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", text)) if fmt == "html" else text


def _json(*args: str) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _head(text: str) -> str:
    """What comes before the report's first table section."""
    return text.split("Summary")[0]


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_every_report_opens_with_the_verdict_block_of_analyze(tmp_path, fmt):
    trace = library.bundled_trace()
    doc = _json("analyze", str(trace))
    pred = doc["steps"][0]["floors"]["predicted_graph_step_time_ns"]
    assert f"{pred / 1e6:.3f}" == "5.892"  # the README's what-if of the bundled trace
    head = _flat(_report(tmp_path, fmt, str(trace)))
    head = _head(head)
    assert "5.892 ms" in head and "launch-bound" in head and "untraced (estimated)" in head
    # the same sentences as the terminal's analyze, word for word (one source of the block)
    r = CliRunner().invoke(app, ["analyze", str(trace)], env={"COLUMNS": "400"})
    term = _flat(r.stdout)
    for sentence in re.findall(r"(this step would take about [^)]+\)|step [\d.]+ ms \(under nsys [^;]+;)", head):
        assert sentence in term


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_compare_report_opens_with_speedup_and_prediction_error(tmp_path, fmt):
    doc = _json("compare", str(EAGER), str(GRAPH))
    assert f"{doc['speedup']:.2f}×" == "5.10×" and f"{100 * doc['prediction_error']:+.1f}" == "+0.7"
    head = _head(_flat(_report(tmp_path, fmt, str(EAGER), "--compare", str(GRAPH))))
    assert "speedup (A/B): 5.10×" in head.replace("**", "")
    assert "+0.7%" in head and f"{doc['prediction_reference_ns'] / 1e6:.3f} ms" in head
    assert "5.1041" not in head  # the ratio at two decimals, whatever its JSON carries


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_a_vllm_report_has_the_engine_step_anatomy(tmp_path, fmt):
    e = _json("analyze", str(VLLM))["steps"][0]["engine"]
    head = _head(_flat(_report(tmp_path, fmt, str(VLLM))))
    assert "vLLM engine step" in head and f"forward {e['forward_ns'] / 1e6:,.3f} ms" in head
    assert "vLLM engine step" not in _head(_flat(_report(tmp_path, fmt, str(EAGER))))  # only a vLLM trace's


def test_budget_opens_with_the_verdict_block():
    r = CliRunner().invoke(app, ["budget", str(EAGER), "--cells", str(CELLS)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    first = r.stdout.splitlines()[:3]
    assert first[0].startswith("Verdict: decode step is launch-bound") and "5.892 ms" in first[0]
    assert any(x.startswith("what-if CUDA graph:") for x in first)
    doc = _json("budget", str(EAGER), "--cells", str(CELLS))
    assert doc["verdict_block"][0]["label"] == "Verdict"


def test_report_reads_the_budgets_shape_from_the_sidecar_like_budget(tmp_path):
    """vLLM's step names record neither model nor context: the sidecar does, for both commands."""
    text = _report(tmp_path, "md", str(VLLM), "--cells", str(CELLS))
    assert "byte budget skipped" not in text and "### Byte budget" in text
    doc = _json("budget", str(VLLM), "--cells", str(CELLS))
    assert nbytes_in(text, doc["step"]["measured_bytes"])


def nbytes_in(text: str, b: int) -> bool:
    from stepscope.render.units import nbytes

    return f"step: {nbytes(b)} measured" in text


def test_report_takes_budgets_shape_options(tmp_path):
    bare = tmp_path / "bare.sqlite"  # the vLLM export without its sidecar
    shutil.copy(VLLM, bare)
    text = _report(tmp_path, "md", str(bare), "--cells", str(CELLS))
    assert "byte budget skipped" in text and "--model" in text and "--context" in text
    (tmp_path / "r.md").unlink()
    text = _report(tmp_path, "md", str(bare), "--cells", str(CELLS), "--model", "llama-3.1-8b", "--context", "2048")
    assert "byte budget skipped" not in text and "### Byte budget" in text


def test_a_torch_profiler_trace_is_not_called_nsys():
    r = CliRunner().invoke(app, ["analyze", str(TORCH)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "torch.profiler trace" in r.stdout.splitlines()[0]
    assert "nsys ?" not in r.stdout and "under nsys" not in r.stdout and "without nsys" not in r.stdout
    assert "under torch.profiler" in r.stdout
    assert "· 3 steps" in r.stdout.splitlines()[0]
