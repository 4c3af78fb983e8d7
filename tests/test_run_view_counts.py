"""The run view's counts as a reader reads them: step, verdict and launch counts of a thousand or more
with a thousands separator, as every other figure of the screen (`1,092 launches`, `6,925 phase
unknown`), on the terminal, in the Markdown and in the HTML report (render/run.py).

DeepSeek-V2-Lite's whole run (fixtures/models/) has eager prefill steps of over a thousand launches
among its slowest; the counts shown are the document's own (`analyze --json`), this tests their
form, not their value (tests/test_classes_models.py and the segmentation tests check those).
"""

from __future__ import annotations

import json
import re

from stepscope.cli import app
from tests.conftest import FIXTURES, CliRunner, gunzipped

DEEPSEEK = FIXTURES / "models" / "deepseek-v2-lite_r32_graph_plain.sqlite.gz"
# a count of four digits or more without its separator, before the words the run view counts
BARE = re.compile(r"(?<![\d,.])\d{4,} (?:launches|steps?\b|decode|prefill|mixed|phase unknown|device-bound|"
                  r"launch-bound|host-bound)")


def _invoke(*args: str, columns: int = 100):
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns), "STEPSCOPE_NO_CACHE": "1"})
    assert r.exit_code == 0, r.output[-2000:]
    return r


def test_run_view_counts_have_separators(tmp_path):
    p = gunzipped(DEEPSEEK)
    doc = json.loads(_invoke("analyze", str(p), "--json", "--no-cache").stdout)
    big = [r["n_launch_calls"] for r in doc["run"]["slowest"]
           if r["verdict"] == "launch-bound" and r["n_launch_calls"] >= 1000]
    assert big, "the capture no longer has a launch-bound slowest step of 1,000 launches or more"
    terminal = " ".join(_invoke("analyze", str(p), "--no-cache", columns=200).stdout.split())
    md = tmp_path / "r.md"
    html = tmp_path / "r.html"
    _invoke("report", str(p), "-o", str(md))
    _invoke("report", str(p), "-o", str(html))
    for name, text in (("terminal", terminal), ("markdown", md.read_text(encoding="utf-8")),
                       ("html", html.read_text(encoding="utf-8"))):
        run = text[: text.find("Summary")] if name != "terminal" else text
        assert not BARE.findall(run), (name, BARE.findall(run))
        for n in big:
            assert f"launch-bound: {n:,} launches" in run, (name, n)
