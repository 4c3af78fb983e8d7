"""One unit policy for people (stepscope/render/units.py): whole-step figures in ms, parts of a
step in µs, the same in the terminal and in the reports."""

from __future__ import annotations

from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.render.units import ms, ms_num, nbytes, tick, us, us_num
from tests.conftest import FIXTURES, need, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"


def _term(*args: str, columns: int | None = None) -> str:
    """A command's terminal output, through main()'s boundary in this process (a pipe's width
    unless `columns`)."""
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns) if columns else None})
    assert r.exit_code == 0, r.output
    return r.stdout


def test_formatters():
    assert ms(29_868_123) == "29.868 ms" and ms(None) == "–" and ms(1_250_000, sign=True) == "+1.250 ms"
    assert us(68_249) == "68.2 µs" and us(-3_100, sign=True) == "-3.1 µs" and us_num(3_860_300) == "3,860.3"
    assert ms_num(4_573_000) == "4.573"
    assert [tick(x) for x in (0, 512, 1024, 16_384, 131_072, 500_000, 2_000_000, -500_000, 2_500)] == \
        ["0", "512 ns", "1.0 µs", "16 µs", "131 µs", "500 µs", "2 ms", "-500 µs", "2.5 µs"]
    assert [nbytes(x) for x in (15_530_000_000, -2_100_000, 512, None)] == ["15.53 GB", "-2.10 MB", "512 B", "–"]


def test_terminal_and_reports_write_a_figure_alike(tmp_path):
    """The step time (a whole-step figure) and the GEMM class time (a part) read the same in
    `analyze`, the Markdown report and the HTML report; both figures from plain SQL."""
    con = ro(need(EAGER))
    gemm_ns = con.execute("""SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                             JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nvjet%'""").fetchone()[0]
    span_ns = con.execute("""SELECT max(e) - min(s) FROM (SELECT start s, end e FROM CUPTI_ACTIVITY_KIND_KERNEL
                             UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET)""").fetchone()[0]
    term = _term("analyze", str(EAGER))
    out = {}
    for ext in ("md", "html"):
        r = CliRunner().invoke(app, ["report", str(EAGER), "-o", str(tmp_path / f"r.{ext}")])
        assert r.exit_code == 0, r.output
        out[ext] = (tmp_path / f"r.{ext}").read_text()
    # the GEMMs of this step are the nvjet kernels (129 of them)
    assert f"gemm             │   129 │ {us_num(gemm_ns)} │" in term
    assert f"| gemm | 129 | {us(gemm_ns)} |" in out["md"] and f"<td>129</td><td>{us(gemm_ns)}</td>" in out["html"]
    # GPU span (first kernel start to last activity end) is a whole-step figure: ms everywhere
    assert f"span {ms(span_ns)}" in term and f"| GPU span | {ms(span_ns)} |" in out["md"]
    assert f"<td>GPU span</td><td>{ms(span_ns)}</td>" in out["html"]


# --- one policy in every format (issue 32) ---------------------------------------------------

VLLM = FIXTURES / "vllm" / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
TORCH = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"


def _outputs(tmp_path, *args: str, report: tuple = ()) -> dict[str, str]:
    """The terminal output of `analyze`-like `args` and the Markdown and HTML reports of `report`."""
    out = {"term": _term(*args, columns=200)}
    for ext in ("md", "html"):
        r = CliRunner().invoke(app, ["report", *report, "-o", str(tmp_path / f"r.{ext}")])
        assert r.exit_code == 0, r.output
        out[ext] = (tmp_path / f"r.{ext}").read_text()
    return out


def test_the_engine_anatomy_reads_alike_in_every_format(tmp_path):
    """A vLLM step's forward (a whole-step figure) is in ms on the terminal, in the Markdown and
    in the HTML report (the Markdown had `forward 36,267.3 µs`)."""
    import json

    doc = json.loads(CliRunner().invoke(app, ["analyze", str(need(VLLM)), "--json"]).stdout)
    e = doc["steps"][0]["engine"]
    out = _outputs(tmp_path, "analyze", str(VLLM), report=(str(VLLM),))
    for fmt, text in out.items():
        assert f"forward {ms(e['forward_ns'])}" in text, fmt
        assert f"forward {us(e['forward_ns'])}" not in text, fmt
        assert f"sampling {ms(e['sample_ns'])}" in text, fmt


def test_node_gaps_ratios_and_signs_alike_in_every_format(tmp_path):
    """The gap between graph nodes in µs with two decimals (never `446 ns` beside `0.45 µs`), a
    ratio with two decimals (never `5.1041×`), a signed percentage with a true minus sign, in
    compare, tp and the reports alike."""
    import re

    out = _outputs(tmp_path, "compare", str(need(EAGER)), str(need(GRAPH)),
                   report=(str(EAGER), "--compare", str(GRAPH)))
    out["analyze"] = _term("analyze", str(EAGER))
    out["tp"] = CliRunner().invoke(app, ["tp", str(EAGER)], env={"COLUMNS": "200"}).stdout
    gaps = 0
    for fmt, text in out.items():
        text = re.sub(r"<[^>]+>", " ", text)  # HTML's text
        assert not re.search(r"\d ns per (graph node|kernel)", text), fmt
        gaps += len(re.findall(r"\d\.\d\d µs per (?:graph node|kernel between graph nodes)", text))
        assert not re.search(r"\d\.\d{3,}×", text), fmt
        assert not re.search(r"(?<![\w.\d])-\d+(\.\d+)?%", text), (fmt, re.findall(r".{30}-\d+\.\d%", text))
    assert gaps >= 3
    import json

    doc = json.loads(CliRunner().invoke(app, ["compare", str(EAGER), str(GRAPH), "--json"]).stdout)
    err = f"{100 * doc['prediction_error']:+.1f}%".replace("-", "\u2212")  # A's what-if against B's step
    for fmt in ("term", "md", "html"):
        assert f"{doc['speedup']:.2f}×" in out[fmt], fmt
        assert f"prediction error: {err}" in re.sub(r"<[^>]+>|\*\*", "", out[fmt]).replace(":  ", ": "), fmt


def test_counts_and_step_numbers(tmp_path):
    """A count of one is singular; a step is named by its index (the JSON's), beside its trace's
    count of steps, never `step 2 of 3`."""
    import json
    import re

    out = _outputs(tmp_path, "analyze", str(need(GRAPH)), report=(str(need(TORCH)),))
    assert "1 launch call," in out["term"] and "1 launch calls" not in out["term"]
    assert "· 1 step" in out["term"] and "1 steps" not in out["term"]
    steps = json.loads(CliRunner().invoke(app, ["analyze", str(TORCH), "--json"]).stdout)["steps"]
    quoted = re.search(r"step (\d+) · (\d+) steps in the trace", out["md"])
    assert quoted and int(quoted.group(2)) == len(steps) and int(quoted.group(1)) in [s["index"] for s in steps]
    for fmt, text in out.items():
        assert not re.search(r"\bstep \d+ of \d+\b", text), fmt
        assert not re.search(r"\b1 (steps|kernels|launch calls|reports|ranks|hosts|TP steps)\b", text), fmt


def test_a_torch_profiler_trace_never_says_nsys(tmp_path):
    """What traced a step is named by its trace: a torch.profiler (Kineto) trace is estimated
    `under torch.profiler`, never `under nsys`, `without nsys` or `nsys ?`."""
    import re

    out = _outputs(tmp_path, "analyze", str(need(TORCH)), report=(str(TORCH),))
    for fmt, text in out.items():
        text = re.sub(r"<[^>]+>", " ", text)
        assert not re.search(r"under nsys|without nsys|nsys \?|nsys's own", text), fmt
    assert "torch.profiler" in out["term"] and "under torch.profiler" in out["md"]


def test_no_renderer_formats_a_time_on_its_own():
    """Every time, ratio and signed percentage people read goes through render/units.py: no
    renderer or command divides nanoseconds in an f-string of its own (`/ 1e6:.2f`), writes a
    ratio (`:.2f}×`) or a signed percentage (`:+.1f}%`) itself."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "stepscope"
    pattern = re.compile(r"/\s*1e[36]\s*:|/\s*1e9\s*:[^}]*\}\s*s\b|:\.\d+f\}×|:\+\.\d+f\}%|ns / 1e3|ns / 1e6")
    bad = []
    for path in sorted([*root.glob("render/*.py"), *root.glob("commands/*.py")]):
        if path.name in ("units.py", "html.py"):  # html.py: its JavaScript's own axis code
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                bad.append(f"{path.name}:{n}: {line.strip()}")
    html = (root / "render" / "html.py").read_text()
    bad += [f"html.py: {m.group()}" for m in re.finditer(r"\{[^{}]*/\s*1e[36]\s*:[^{}]*\}", html)]
    assert not bad, bad
