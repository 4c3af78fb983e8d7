"""The nsys recipe `recipes/stepscope_inventory`: its analysis functions on real exports, and the
Recipe class driven through a stand-in of nsys's `nsys_recipe` package (the real run is on the
H200 box: see the README's nsys-recipe section)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from stepscope.api import open_trace
from tests.conftest import FIXTURES, ROOT, need

# the recipe hands pandas frames to nsys: pandas (and pyarrow, polars' way there) are the
# stepscope[pandas] extra, which the test extra includes
pd = pytest.importorskip("pandas", reason="pandas is the stepscope[pandas] extra")
pytest.importorskip("pyarrow", reason="pyarrow is the stepscope[pandas] extra")

RECIPE = ROOT / "recipes" / "stepscope_inventory" / "stepscope_inventory.py"
REPORTS = [FIXTURES / "llama8b_decode_b1_eager.sqlite", FIXTURES / "llama8b_decode_b8_eager.sqlite"]


def load_recipe_module(name: str = "stepscope_inventory_under_test"):
    spec = importlib.util.spec_from_file_location(name, RECIPE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_metadata_names_the_module():
    import json

    meta = json.loads((RECIPE.parent / "metadata.json").read_text())
    assert meta["module_name"] == RECIPE.stem == RECIPE.parent.name


def test_inventory_and_reduce_match_stepscope():
    mod = load_recipe_module()
    results = [mod.inventory_of(need(p)) for p in REPORTS]
    out = mod.reduce_inventories(results[::-1])
    assert out["files"]["report"].tolist() == sorted(p.name for p in REPORTS)
    for p in REPORTS:
        inv = open_trace(p).inventory
        got = out["inventory"][out["inventory"]["report"] == p.name]
        assert got["count"].sum() == inv.classes["count"].sum()
        assert got["time_ns"].sum() == inv.classes["time_ns"].sum()
        assert (out["steps"][out["steps"]["report"] == p.name]["n_kernels"].tolist()
                == inv.steps["n_kernels"].to_list())
    gemm = out["summary"][(out["summary"]["class"] == "gemm")]
    assert gemm["median_count"].tolist() == [129.0, 129.0]


STUB = {
    "nsys_recipe/__init__.py": "",
    "nsys_recipe/log.py": """
        import logging
        logger = logging.getLogger("nsys_recipe")
        def time(label):
            return lambda f: f
    """,
    "nsys_recipe/lib/__init__.py": "",
    "nsys_recipe/lib/args.py": """
        import enum
        class Option(enum.Enum):
            INPUT = "input"
            CSV = "csv"
    """,
    "nsys_recipe/lib/recipe.py": """
        import argparse, json, os
        from nsys_recipe.lib.args import Option
        class _Parser(argparse.ArgumentParser):
            def add_recipe_argument(self, opt, *a, **k):
                if opt is Option.INPUT:
                    return self.add_argument("--input", nargs="+", required=k.get("required", False))
                if opt is Option.CSV:
                    return self.add_argument("--csv", action="store_true")
                return self.add_argument(opt, *a, **k)
        class Recipe:
            def __init__(self, parsed_args):
                self._parsed_args = parsed_args
                self._output_files = []
                self._analysis_dict = {}
            def run(self, context):
                os.makedirs(self._parsed_args.output, exist_ok=True)
            def add_output_file(self, name):
                path = os.path.join(self._parsed_args.output, name)
                self._output_files.append(path)
                return path
            def create_analysis_file(self):
                with open(os.path.join(self._parsed_args.output, "analysis.json"), "w") as f:
                    json.dump({k: str(v) for k, v in self._analysis_dict.items()}, f)
            @classmethod
            def get_argument_parser(cls):
                p = _Parser()
                p.add_argument("--output")
                return p
    """,
}


class SerialContext:
    def map(self, fn, items, **kw):
        return [fn(i, **kw) for i in items]

    def wait(self, futures):
        return futures


def test_recipe_class_runs_under_a_stand_in_nsys_recipe(tmp_path, monkeypatch):
    for rel, text in STUB.items():
        f = tmp_path / "stub" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    for m in [m for m in sys.modules if m.startswith("nsys_recipe")]:
        monkeypatch.delitem(sys.modules, m)
    mod = load_recipe_module("stepscope_inventory_with_stub")
    assert mod.recipe is not None
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not sqlite")
    args = mod.StepscopeInventory.get_argument_parser().parse_args(
        ["--input", *map(str, map(need, REPORTS)), str(bad), "--csv", "--output", str(tmp_path / "out")])
    r = mod.StepscopeInventory(args)
    r.run(SerialContext())
    out = tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    for base in ("files", "steps", "inventory", "summary"):
        assert f"{base}.parquet" in names and f"{base}.csv" in names
    files = pd.read_parquet(out / "files.parquet")
    assert files["report"].tolist() == sorted(p.name for p in REPORTS)  # the bad report is logged and skipped
    assert (out / "analysis.json").exists()


class DaskFuturesContext:
    """What nsys recipe's `--mode dask-futures` hands the mapper: map() submits to a dask
    client and returns futures, wait() gathers their results."""

    def __init__(self, client):
        self.client = client

    def map(self, fn, items, **kw):
        return self.client.map(fn, list(items), pure=False, **kw)

    def wait(self, futures):
        return self.client.gather(futures)


def test_recipe_in_dask_futures_mode_gives_the_run_view(tmp_path, monkeypatch):
    """The recipe's mapper on dask workers runs stepscope.library.report_result, and its reducer
    adds the run's tables: the same figures as `stepscope analyze R1 R2 --json`."""
    pytest.importorskip("distributed")
    import cloudpickle
    from distributed import Client, LocalCluster

    from stepscope import distribute, library
    from stepscope.render.reports_run import run_dict

    spec = importlib.util.spec_from_file_location("stepscope_split_reports", ROOT / "benchmarks" / "split_reports.py")
    split = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(split)
    reports = split.split_by_process(FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite", tmp_path / "r")
    for rel, text in STUB.items():
        f = tmp_path / "stub" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    for m in [m for m in sys.modules if m.startswith("nsys_recipe")]:
        monkeypatch.delitem(sys.modules, m)
    mod = load_recipe_module("stepscope_inventory_on_dask")
    sys.modules[mod.__name__] = mod
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    cloudpickle.register_pickle_by_value(mod)
    args = mod.StepscopeInventory.get_argument_parser().parse_args(
        ["--input", *map(str, reports), "--output", str(tmp_path / "out")])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, Client(c) as cl:
        mod.StepscopeInventory(args).run(DaskFuturesContext(cl))
    got = pd.read_parquet(tmp_path / "out" / "run_ranks.parquet")
    tp = pd.read_parquet(tmp_path / "out" / "tp_steps.parquet")
    monkeypatch.setattr(distribute, "have_dask", lambda: False)
    doc = run_dict(library.run(reports, cache=False))
    want = [s for r in doc["run_ranks"] for s in r["steps"]]
    assert got["collective_wait_ns"].tolist() == [s["collective_wait_ns"] for s in want]
    assert got["device_floor_ns"].tolist() == [s["device_floor_ns"] for s in want]
    assert got["rank"].tolist() == [r["rank"] for r in doc["run_ranks"] for _ in r["steps"]]
    assert tp["verdict"].tolist() == [g["verdict"] for g in doc["tp_steps"]]
    assert tp["binding_rank"].tolist() == [1]
