"""The Python API and the library functions the commands call (issues 18 and 22): each checked
against what the command line prints or writes for the same fixture, or against plain SQL."""

from __future__ import annotations

import builtins
import json
import sys

import polars as pl
import pytest
from tests.conftest import CliRunner

import stepscope
from stepscope.analysis.gaps import KINDS
from stepscope.api import PANDAS_HINT, open_trace
from stepscope.cli import app
from tests.conftest import FIXTURES, need, ro
from tests.sqlref import LAUNCH_LIKE

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
VLLM = FIXTURES / "vllm" / "llama8b_decode_b1_eager.sqlite"
TORCH = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"
CELLS = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"


def cli(*args) -> str:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.parametrize("path", [EAGER, GRAPH, TP2, VLLM, TORCH], ids=lambda p: p.name)
def test_to_dict_is_the_analyze_json_document(path):
    """Floors, gaps, launch, tp, untraced and engine sections included, for every step."""
    doc = json.loads(cli("analyze", "--json", need(path)))
    mine = open_trace(path).to_dict()
    assert {"gaps", "launch", "floors"} <= set(doc["steps"][0])
    assert mine == doc


def test_to_dict_of_chosen_steps_is_analyze_json_of_them():
    assert open_trace(TP2).to_dict("1") == json.loads(cli("analyze", "--json", "--steps", "1", need(TP2)))


def _launch_calls(path) -> int:
    like = " OR ".join(f"s.value LIKE '{p}'" for p in LAUNCH_LIKE)
    return ro(path).execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE {like}").fetchone()[0]


@pytest.mark.parametrize("path, verdict", [(EAGER, "launch-bound"), (GRAPH, "device-bound")], ids=["eager", "graph"])
def test_table_carries_floors_verdict_and_gap_kinds(path, verdict):
    a = open_trace(need(path))
    t = a.table
    doc = json.loads(cli("analyze", "--json", path))
    assert t.height == len(doc["steps"]) == 1
    row, step = t.row(0, named=True), doc["steps"][0]
    # the figures against plain SQL: every kernel and every launch call of the one-step trace
    assert row["n_kernels"] == ro(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert row["n_launch_calls"] == _launch_calls(path)
    # the verdict the fixture is known for (eager b1 decode: launch-bound; its graph capture: not)
    assert row["verdict"] == verdict
    assert (row["cpu_floor_ns"] > row["device_floor_ns"]) == (verdict == "launch-bound")
    for k in ("cpu_floor_ns", "device_floor_ns", "t_launch_ns", "host_bound_gap_ns",
              "predicted_graph_step_time_ns", "verdict"):
        assert row[k] == step["floors"][k], k
    assert round(row["margin"], 3) == step["floors"]["margin"]  # the document's three decimals
    for k in KINDS:
        assert (row[f"{k}_gaps"], row[f"{k}_gap_ns"]) == (step["gaps"][k]["count"], step["gaps"][k]["time_ns"]), k
    assert sum(row[f"{k}_gap_ns"] for k in KINDS) == row["idle_ns"]
    assert row["untraced_step_time_ns"] == step["untraced_step_time_ns"]


def test_table_of_a_multi_rank_trace_has_a_row_per_step_with_its_verdict():
    a = open_trace(need(TP2))
    doc = json.loads(cli("analyze", "--json", TP2))
    assert a.table["index"].to_list() == [s["index"] for s in doc["steps"]]
    assert a.table["verdict"].to_list() == [s["floors"]["verdict"] for s in doc["steps"]]
    assert a.table["device"].to_list() == [s["device"] for s in doc["steps"]]


def test_steps_are_built_once(monkeypatch):
    import stepscope.api as api

    a = open_trace(need(TP2))
    built = []
    init = api.Step.__init__
    monkeypatch.setattr(api.Step, "__init__", lambda self, *x: (built.append(1), init(self, *x))[1])
    for _ in range(3):
        for i in range(len(a)):
            assert a.steps[i].index == a.table["index"][i]
    assert len(built) == len(a) == 2
    assert a.steps[1] is a.steps[1] is a.step(a.table["index"][1])
    s = a.steps[1]
    # a step's tables are its rows of the inventory's
    assert s.classes.equals(a.inventory.classes.filter(pl.col("step") == s.index).drop("step"))
    assert s.kernels.select("count", "time_ns").sum().row(0) == s.classes.select("count", "time_ns").sum().row(0)
    assert s.kernels.filter(pl.col("class") != "memops")["count"].sum() == s.n_kernels
    assert s.verdict == a.table["verdict"][1]


def test_repr_and_html_say_the_verdict():
    a = open_trace(need(EAGER))
    text = repr(a)
    assert text.startswith("<stepscope.Analysis of llama8b_decode_b1_eager.sqlite: 1 step (1 launch-bound)")
    # the terminal's figures (analyze's verdict line quotes the same step time and prediction)
    line = cli("analyze", EAGER)
    step_ms = f"{a.table['step_time_ns'][0] / 1e6:.3f} ms"
    assert step_ms in text and step_ms in line
    assert repr(a.steps[0]).startswith("<stepscope.Step 0: decode step, launch-bound")
    html = a._repr_html_()
    assert html.count("<tr>") == 2 and "launch-bound" in html and step_ms in html
    assert "<table>" in a.steps[0]._repr_html_() and "gemm" in a.steps[0]._repr_html_()


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch):
    a = open_trace(need(EAGER))
    real = builtins.__import__

    def no_pandas(name, *args, **kw):
        if name.split(".")[0] in ("pandas", "pyarrow"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    for x in (a, a.steps[0]):
        with pytest.raises(ImportError) as e:
            x.to_pandas()
        assert str(e.value) == PANDAS_HINT and "\n" not in str(e.value)


def test_library_functions_are_exported():
    for name in ("open_trace", "compare", "tp", "budget", "report", "export"):
        assert name in stepscope.__all__
        assert callable(getattr(stepscope, name))
    from stepscope import library

    assert stepscope.compare is library.compare and stepscope.report is library.report


def test_compare_is_the_compare_json_document():
    doc = json.loads(cli("compare", "--json", need(EAGER), need(GRAPH)))
    assert json.loads(json.dumps(stepscope.compare(EAGER, GRAPH))) == doc
    # the same from Analysis objects, and the verdicts are analyze's
    a, b = open_trace(EAGER), open_trace(GRAPH)
    assert json.loads(json.dumps(stepscope.compare(a, b))) == doc
    assert (doc["a"]["verdict"], doc["b"]["verdict"]) == (a.table["verdict"][0], b.table["verdict"][0])


def test_tp_is_the_tp_json_document():
    assert json.loads(json.dumps(stepscope.tp(need(TP2)))) == json.loads(cli("tp", "--json", TP2))
    numbers = ["--kernels", "1000", "--launch-us", "5", "--device-ms", "4"]
    assert (json.loads(json.dumps(stepscope.tp(kernels=1000, launch_us=5, device_ms=4)))
            == json.loads(cli("tp", "--json", *numbers)))


def test_budget_is_the_budget_json_document():
    doc = json.loads(cli("budget", "--json", need(EAGER), "--cells", need(CELLS)))
    assert json.loads(json.dumps(stepscope.budget(EAGER, CELLS), default=str)) == doc
    assert doc["step"]["measured_bytes"] > doc["step"]["min_bytes"] > 0


@pytest.mark.parametrize("ext", [".md", ".html"])
def test_report_is_what_the_command_writes(tmp_path, ext):
    out = tmp_path / f"r{ext}"
    cli("report", need(EAGER), "-o", out, "--compare", need(GRAPH))
    done = stepscope.report(EAGER, compare=GRAPH, format=ext)
    assert done.path is None and done.steps == (0, 0)
    assert done.content == out.read_text()


def test_export_is_what_the_command_writes(tmp_path):
    out = tmp_path / "e.json"
    cli("export", need(EAGER), "-o", out)
    done = stepscope.export(EAGER)
    assert json.loads(done.content) == json.loads(out.read_text()) == done.document
    kernels = ro(EAGER).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert sum(1 for e in done.document["traceEvents"] if e["ph"] == "X" and e.get("cat") not in
               ("launch", "step", "memops")) == kernels


def test_bad_input_is_one_input_error():
    with pytest.raises(stepscope.InputError, match="--widths"):
        stepscope.tp(kernels=1, launch_us=1, device_ms=1, widths="0")
    with pytest.raises(stepscope.InputError):
        stepscope.report(EAGER, format=".txt")


def test_import_stepscope_loads_no_polars():
    import subprocess

    code = "import sys, stepscope; stepscope.__all__; print('polars' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=FIXTURES.parent)
    assert r.stdout.strip() == "False"


def test_one_pass_lets_the_trace_frames_go_and_keeps_the_inventory():
    """report, export, budget and compare load with ONE_PASS: the trace's own kernel, memop and
    API frames are emptied once the activities hold their rows; the activities stay whole."""
    from stepscope import library
    from stepscope.analysis.memory import KEEP, ONE_PASS

    con = ro(EAGER)
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    memops = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                 for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if t in tables)
    kept = library.load(EAGER, launch_config=True, memory=KEEP, cache=False)
    one = library.load(EAGER, launch_config=True, memory=ONE_PASS, cache=False)
    assert kept.trace.kernels.height == kernels
    for frame in ("kernels", "api", "memops"):
        assert frame in kept.trace.__dict__ and frame not in one.trace.__dict__
        with pytest.raises(AttributeError, match="let go once the analysis held its rows"):
            getattr(one.trace, frame)
    assert one.acts.height == kept.acts.height == kernels + memops
    assert one.acts.columns == kept.acts.columns and one.steps.equals(kept.steps)


def test_every_library_function_takes_a_path_or_an_analysis(tmp_path):
    """report, export and budget accept the Analysis open_trace returned, as compare and tp do,
    and give what they give for its path."""
    path = FIXTURES / "llama8b_decode_b1_eager.sqlite"
    cells = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
    a = open_trace(path)
    assert stepscope.report(a, format="markdown").content == stepscope.report(path, format="markdown").content
    assert stepscope.export(a).document == stepscope.export(path).document
    by_a, by_path = stepscope.budget(a, cells), stepscope.budget(path, cells)
    assert by_a["step"] == by_path["step"] and by_a["verdict_block"] == by_path["verdict_block"]


def test_readable_reprs_and_the_json_names():
    path = FIXTURES / "llama8b_decode_b1_eager.sqlite"
    w = stepscope.report(path, format="html")
    assert len(repr(w)) < 120 and "not written" in repr(w) and "steps [0]" in repr(w)
    a = open_trace(path)
    doc = a.to_dict()
    assert "index" in a.table.columns and "step" not in a.table.columns  # as the JSON names it
    assert a.table["index"].to_list() == [s["index"] for s in doc["steps"]]
    s = a.steps[0]
    assert {"verdict", "step_time_ns", "gpu_busy_ns", "index"} <= set(dir(s))
    assert s.verdict == doc["steps"][0]["floors"]["verdict"]


def test_compare_tp_report_export_take_options_as_analyze_does(tmp_path):
    """compare, tp, report and export take pipeline.Options (analyze's): its step regex and
    strict reach each analysis (a pattern matching no range is refused under strict, nothing
    written), the document equals the one of the keyword arguments it stands for, and giving
    both is refused."""
    from stepscope import library
    from stepscope.errors import InputError
    from stepscope.pipeline import Options

    a, b = need(EAGER), need(GRAPH)
    bogus = Options(step_regex="^no such range$", strict=True)
    out = tmp_path / "r.md"
    for call in (lambda: library.compare(a, b, bogus), lambda: library.tp(a, bogus),
                 lambda: library.report(a, out, bogus), lambda: library.export(a, tmp_path / "e.json", bogus)):
        with pytest.raises(InputError, match=r"\(--strict\)"):
            call()
    assert not out.exists() and not (tmp_path / "e.json").exists()
    lenient = library.compare(a, b, Options(step_regex="^no such range$"))
    assert lenient == library.compare(a, b, step_regex="^no such range$")
    assert library.tp(a, Options()) == library.tp(a)
    with pytest.raises(TypeError, match="not both"):
        library.compare(a, b, Options(), strict=True)
