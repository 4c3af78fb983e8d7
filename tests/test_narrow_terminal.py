"""Terminal tables readable at 80 columns (and 120): no cell that tells rows apart cut with `…`,
no number split from its unit across lines; the full detail stays in --json."""

from __future__ import annotations

import json
import re

import pytest
from tests.conftest import CliRunner

from stepscope import distribute
from stepscope.cli import app
from tests.conftest import FIXTURES, SERVING, gunzipped, need

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
GRAPH_TP2 = FIXTURES / "llama8b_decode_b1_graph_tp2.sqlite"
X2 = FIXTURES / "llama8b_decode_b1_eager_x2.sqlite"
TORCH = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"
VLLM_SYNC = FIXTURES / "vllm" / "llama8b_decode_b1_eager_sync.sqlite"
SWEEP = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
STEP_CELLS = FIXTURES / "ncu" / "step_vllm_llama8b_decode_b1" / "cells.parquet"
RAW_CSV = FIXTURES / "ncu" / "smoke_ncu_raw.csv"
SERVE_EAGER = SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz"
SERVE_GRAPH = SERVING / "llama-3.1-8b_serve_r48_s0_graph.sqlite.gz"


def _run(columns: int, *args: str) -> str:
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.stdout


def _no_unit_split(out: str) -> None:
    """A number's unit never starts the next line (`4.573\\nms`), indented or not."""
    assert not re.search(r"\d[ \t]*\n[ \t]*(ms|µs|ns|GB|MB|KB|%|×)(\W|$)", out), out


def _fits(out: str, columns: int) -> list[str]:
    """Every line within the width; the table rows (lines with a column rule)."""
    lines = out.splitlines()
    wide = [x for x in lines if len(x) > columns]
    assert not wide, wide[:3]
    _no_unit_split(out)
    return [x for x in lines if "│" in x]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.split("│")]


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


def _trace(path):
    return gunzipped(need(path)) if path.name.endswith(".gz") and path.suffix == ".gz" and "sqlite" in path.name else need(path)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", [[EAGER], [GRAPH], [TORCH], [TP2], [SERVE_EAGER], [EAGER, X2]],
                         ids=["eager", "graph", "torch-profiler", "tp2", "serving-run", "two-reports"])
def test_analyze_at_80_and_120_columns(columns, args, monkeypatch):
    """analyze: every line within the width, no number parted from its unit, no table cell cut;
    every class of the quoted step's class table on a row of its own, whole."""
    if len(args) > 1:  # the reports one after another: the same run view as on a dask cluster
        # (test_many_reports checks that), without a cluster's start (~10 s on this 2-core box)
        monkeypatch.setattr(distribute, "have_dask", lambda: False)
    paths = [str(_trace(a)) for a in args]
    out = _run(columns, "analyze", *paths)
    rows = _fits(out, columns)
    assert rows and not [x for x in rows if "…" in x], [x for x in rows if "…" in x][:3]
    quoted = [int(m) for m in re.findall(r"\(step (\d+): the median by step time", out.replace("\n", " "))]
    if len(args) == 1 and " class " in out:
        doc = json.loads(_run(columns, "analyze", *paths, "--json"))
        firsts = {_cells(x)[0] for x in rows}
        for st in doc["steps"]:
            if st["index"] in quoted or len(doc["steps"]) == 1:
                assert set(st["classes"]) <= firsts, (set(st["classes"]) - firsts)


def _budget_rows(rows: list[str]) -> list[tuple[str, str, str]]:
    """(class, op, calls) of each row of budget's table: class and op side by side on a wide
    terminal; a class's header row above its ops on a narrow one."""
    out, group = [], None
    for row in rows:
        c = _cells(row)
        if not any(c[1:]):  # a class's header row (stacked layout)
            group = c[0]
        elif c[0] in ("step", "") and len(c) > 1 and c[1] in ("step", ""):
            continue
        elif c[0] == "step":
            continue
        elif group is not None:
            out.append((group, c[0], c[1]))
        else:
            out.append((c[0], c[1], c[2]))
    return out


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("trace,cells", [(EAGER, SWEEP), (VLLM_SYNC, STEP_CELLS)], ids=["sweep", "step-cells"])
def test_budget_rows_stay_distinguishable_at_80_and_120_columns(columns, trace, cells):
    """budget: the (class, op) of each row is whole (the five GEMM ops were `gemm…` at 80
    columns), one line per row, and the rows are those of --json, each once."""
    args = ["budget", str(need(trace)), "--cells", str(need(cells))]
    rows = _fits(_run(columns, *args), columns)
    doc = json.loads(_run(columns, *args, "--json"))
    want = sorted((r["class"], r["op"] or "(no cell)", str(r["calls"])) for r in doc["rows"])
    got = _budget_rows(rows)
    assert sorted(got) == want
    assert len(set(got)) == len(got)
    assert not [x for x in rows if "…" in x]
    if columns == 80:  # the stacked layout: a class once, above its ops
        assert any(_cells(x)[0] == "gemm" and not any(_cells(x)[1:]) for x in rows)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("cells", [SWEEP, STEP_CELLS, RAW_CSV], ids=["sweep", "step-cells", "raw-csv"])
def test_cells_show_one_line_per_launch_at_80_and_120_columns(columns, cells):
    """cells show: one line per profiled launch (the 436 kernels of a step were 6,141 lines at
    80 columns), told apart by cell and launch number, both whole; headers never split inside a
    word."""
    out = _run(columns, "cells", "show", str(need(cells)))
    rows = _fits(out, columns)
    doc = json.loads(_run(columns, "cells", "show", str(need(cells)), "--json"))
    want = [(c["cell"], "" if c["launch"] is None else str(c["launch"])) for c in doc["cells"] if not c.get("error")]
    got = [tuple(_cells(x)[:2]) for x in rows]
    assert got == want and len(set(got)) == len(got)
    assert len(out.splitlines()) <= len(want) + 8
    header = [x for x in out.splitlines() if "┃" in x]
    assert [h.strip() for h in header[-1].split("┃")][:3] == ["cell", "#", "kernel"]
    words = {w for x in header for h in x.split("┃") for w in h.split()}
    assert words <= {"cell", "#", "kernel", "grid", "read", "write", "min", "(cell)", "ampl.", "L2", "hit", "time",
                     "µs", "GB/s"}, words  # a header stacked at its spaces, never inside a word


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("a,b", [(EAGER, GRAPH), (TP2, GRAPH_TP2), (SERVE_EAGER, SERVE_GRAPH)],
                         ids=["eager-graph", "tp2", "serving-runs"])
def test_compare_at_80_and_120_columns(columns, a, b):
    """compare: both file names whole at the top (one per line when they do not fit one), every
    line within the width, no table cell cut."""
    pa, pb = _trace(a), _trace(b)
    out = _run(columns, "compare", str(pa), str(pb))
    rows = _fits(out, columns)
    assert not [x for x in rows if "…" in x], [x for x in rows if "…" in x][:3]
    head = "\n".join(out.splitlines()[:2])
    assert pa.name in head and pb.name in head


def test_sentences_keep_numbers_with_their_units():
    """The Page console wraps a sentence at a space that is not between a number and its unit,
    keeps a line's indent under it, and folds a word longer than a line."""
    from stepscope.render.console import breaks

    text = "  gap 286.1 µs (host-bound): " + "x" * 30 + " → " + "k" * 100 + " launched by 4.661 ms"
    offsets, indent = breaks(text, 40)
    pieces = [text[i:j] for i, j in zip([0] + offsets, offsets + [len(text)])]
    assert indent == 2 and all(len(p.rstrip()) + (indent if n else 0) <= 40 for n, p in enumerate(pieces))
    assert "".join(pieces) == text
    assert not [p for p in pieces if re.match(r"\s*(µs|ms)\b", p)]
