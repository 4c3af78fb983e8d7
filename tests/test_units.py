"""One unit policy for people (stepscope/render/units.py): whole-step figures in ms, parts of a
step in µs, the same in the terminal and in the reports."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.render.units import ms, ms_num, nbytes, tick, us, us_num
from tests.conftest import FIXTURES, need, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"


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
    term = subprocess.run([sys.executable, "-m", "stepscope", "analyze", str(EAGER)], capture_output=True,
                          text=True, timeout=120).stdout
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
