"""Terminal tables readable at 80 columns (and 120): no cell that tells rows apart cut with `…`,
no number split from its unit across lines; the full detail stays in --json."""

from __future__ import annotations

import json
import re

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"


def _run(columns: int, *args: str) -> str:
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.stdout


def _no_unit_split(out: str) -> None:
    """A number's unit never starts the next line (`4.573\\nms`)."""
    assert not re.search(r"\d\s*\n(ms|µs|ns|GB|MB|KB)\b", out), out


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("trace", [TP2, GRAPH], ids=lambda p: p.stem)
def test_tp_at_80_and_120_columns(columns, trace):
    out = _run(columns, "tp", str(trace))
    assert max(len(x) for x in out.splitlines()) <= columns
    table_rows = [x for x in out.splitlines() if "│" in x or "┃" in x]
    assert table_rows and not [x for x in table_rows if "…" in x]
    _no_unit_split(out)
    doc = json.loads(_run(columns, "tp", str(trace), "--json"))
    # every width and its bound is on a row of its mode's table
    for m, p in doc["projections"].items():
        for r in (p or {}).get("rows", ()):
            assert any(re.match(rf"\s*{r['tp']} │.*{r['bound']}", x) for x in table_rows), (m, r)
    for x in doc.get("ranks", ()):
        for st in x["steps"]:
            # rank and step tell a rank's rows apart (pid and GPU beside them on a wide terminal)
            assert any(re.match(rf"\s*{x['rank']} │( +{x['pid']} │ +{x['device']} │)? +{st['step']} │", row)
                       for row in table_rows)


@pytest.mark.parametrize("columns", [80, 120])
def test_compare_names_both_files_at_80_and_120_columns(columns):
    out = _run(columns, "compare", str(EAGER), str(GRAPH))
    first = out.splitlines()[0]
    assert EAGER.name in first and GRAPH.name in first
    assert "5.10×" in out and "5.1041" not in out
