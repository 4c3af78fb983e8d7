"""nsys recipe `stepscope_inventory`: per-step kernel-class inventory across many reports.

    NSYS_RECIPE_PATH=/path/to/stepscope/recipes nsys recipe stepscope_inventory --input rank0.nsys-rep rank1.nsys-rep
    NSYS_RECIPE_PATH=/path/to/stepscope/recipes nsys recipe stepscope_inventory --input reports_dir/ --csv

Each report is analyzed by stepscope itself (stepscope.library.report_result, the per-report
function of `stepscope analyze R1 R2 …`) on its SQLite
export: `<report>.sqlite` next to the report when it exists, else exported once with
`nsys export --type sqlite`. The map step runs per report (in parallel, or on a dask cluster
with nsys recipe's `--mode dask-futures`); the reduce step concatenates and summarizes.

Outputs (parquet, and CSV with --csv):
  files      report → its index (column rank: its place in name order)
  run_ranks  (several reports) one row per rank and step of the run: the collectives matched
             across the reports (transfer vs wait), floors, verdict (`stepscope analyze R1 R2 …`)
  tp_steps   (several reports) one row per TP step: rank skew, binding rank, verdict
  steps      one row per (report, step): stepscope's per-step figures
  inventory  one row per (report, step, class): count, time_ns
  summary    one row per (report, class): steps, median count and median time per step

Needs stepscope importable by nsys's recipe Python: install it there
(`<nsys>/target-linux-x64/python/bin/python3 -m pip install /path/to/stepscope`), or leave
this folder inside a stepscope checkout (its root is put on sys.path) and install polars.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd

_CHECKOUT = Path(__file__).resolve().parents[2]
if (_CHECKOUT / "stepscope" / "__init__.py").exists() and str(_CHECKOUT) not in sys.path:
    sys.path.insert(0, str(_CHECKOUT))

STEP_COLUMNS = (
    "step", "pid", "device", "delimiter", "name", "phase", "step_time_ns", "n_kernels",
    "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns", "n_launch_calls", "launch_call_ns",
)


# ---------------------------------------------------------------- plain functions (tested without nsys)


def sqlite_for(report: str | Path, nsys: str | None = None) -> Path:
    """The SQLite export of a report: the file itself, its sibling .sqlite, or a fresh export."""
    report = Path(report)
    if report.suffix == ".sqlite":
        return report
    sibling = report.with_suffix(".sqlite")
    if sibling.exists() and sibling.stat().st_mtime >= report.stat().st_mtime:
        return sibling
    nsys = nsys or shutil.which("nsys") or _nsys_next_to_recipe_package()
    if nsys is None:
        raise RuntimeError(f"{report}: no SQLite export next to it and no nsys to export it with")
    subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(sibling),
                    str(report)], check=True, stdout=subprocess.DEVNULL)
    return sibling


def _nsys_next_to_recipe_package() -> str | None:
    try:
        import nsys_recipe  # type: ignore
    except ImportError:
        return None
    # <install>/target-linux-x64/python/packages/nsys_recipe → <install>/target-linux-x64/nsys
    for parent in Path(nsys_recipe.__file__).resolve().parents:
        cand = parent / "nsys"
        if cand.is_file():
            return str(cand)
    return None


def inventory_of(report: str | Path, step_regex: str | None = None) -> tuple:
    """(report name, steps frame, class inventory frame, the report's ReportResult) of one
    report: stepscope.library.report_result, the per-report function `stepscope analyze R1 R2 …`
    runs on its dask workers, here on nsys recipe's (`--mode dask-futures`) or in its processes."""
    from stepscope.library import report_result

    res = report_result(sqlite_for(report), step_regex)
    name = Path(report).name
    steps = res.steps.select(list(STEP_COLUMNS)).to_pandas()
    steps.insert(0, "report", name)
    classes = res.classes.to_pandas()
    classes.insert(0, "report", name)
    return name, steps, classes, res


def run_tables(results: list) -> dict[str, pd.DataFrame]:
    """The run view of the reports (analysis/reports_run.py: the collectives matched across them), as
    `stepscope analyze --json R1 R2 …` gives it: one row per rank and step, one per TP step."""
    import polars as pl

    from stepscope.analysis.reports_run import combine, tp_groups
    from stepscope.render.reports_run import RUN_STEP_FIELDS
    from stepscope.render.sentences import tp_sentence

    view = combine([r[3] for r in results])
    paths = pl.DataFrame({"report": list(range(len(results))), "report_name": [r[0] for r in results]})
    ranks = (view.steps.join(paths, on="report").sort("rank", "group", "step")
             .select("rank", "report_name", "host", "pid", "device", *RUN_STEP_FIELDS).rename({"report_name": "report"}))
    groups = tp_groups(view)
    verdicts = [tp_sentence(g) for g in groups.to_dicts()]
    tp = groups.select("group", "ranks", "step_time_ns", "rank_skew_ns", "binding_rank").with_columns(
        verdict=pl.Series(verdicts, dtype=pl.String))
    return {"run_ranks": ranks.to_pandas(), "tp_steps": tp.to_pandas()}


def reduce_inventories(results: list) -> dict[str, pd.DataFrame]:
    """Concatenate the per-report results and summarize each report's classes per step."""
    results = sorted((r for r in results if r is not None), key=lambda r: r[0])
    if not results:
        raise RuntimeError("no report could be analyzed")
    files = pd.DataFrame({"report": [r[0] for r in results]}).rename_axis("rank").reset_index()
    steps = pd.concat([r[1] for r in results], ignore_index=True)
    inventory = pd.concat([r[2] for r in results], ignore_index=True)
    n_steps = steps.groupby("report")["step"].nunique().rename("steps")
    # a step without a class counts as zero of it: fill the report × step × class grid first
    grid = (steps[["report", "step"]].merge(inventory[["class"]].drop_duplicates(), how="cross")
            .merge(inventory, on=["report", "step", "class"], how="left").fillna({"count": 0, "time_ns": 0}))
    summary = (grid.groupby(["report", "class"])
               .agg(median_count=("count", "median"), median_time_ns=("time_ns", "median"),
                    total_time_ns=("time_ns", "sum"))
               .reset_index().merge(n_steps, on="report")
               .sort_values(["report", "total_time_ns"], ascending=[True, False], ignore_index=True))
    out = {"files": files, "steps": steps, "inventory": inventory, "summary": summary}
    if len(results) > 1 and all(len(r) > 3 for r in results):
        out.update(run_tables(results))
    return out


def _map_one(report_path, parsed_args):
    from nsys_recipe.log import logger  # type: ignore

    try:
        return inventory_of(report_path, getattr(parsed_args, "step_regex", None))
    except Exception as e:  # one bad report must not sink the others
        logger.error(f"{report_path}: {e}")
        return None


# ---------------------------------------------------------------- the recipe

try:
    from nsys_recipe import log  # type: ignore
    from nsys_recipe.lib import recipe  # type: ignore
    from nsys_recipe.lib.args import Option  # type: ignore
except ImportError:  # imported outside nsys (tests, docs): the functions above still work
    recipe = None

if recipe is not None:

    class StepscopeInventory(recipe.Recipe):
        @log.time("Mapper")
        def mapper_func(self, context):
            return context.wait(context.map(_map_one, self._parsed_args.input, parsed_args=self._parsed_args))

        def reducer_func(self, mapper_res):
            frames = reduce_inventories(list(mapper_res))
            for name, df in frames.items():
                df.to_parquet(self.add_output_file(f"{name}.parquet"))
                if self._parsed_args.csv:
                    df.to_csv(self.add_output_file(f"{name}.csv"), index=False)

        def save_analysis_file(self):
            self._analysis_dict.update({"EndTime": str(datetime.now()), "Outputs": self._output_files})
            self.create_analysis_file()

        def run(self, context):
            super().run(context)
            self.reducer_func(self.mapper_func(context))
            self.save_analysis_file()

        @classmethod
        def get_argument_parser(cls):
            parser = super().get_argument_parser()
            parser.add_recipe_argument(Option.INPUT, required=True)
            parser.add_recipe_argument(Option.CSV)
            parser.add_recipe_argument(
                "--step-regex", type=str, default=None,
                help="regex for NVTX step range names (stepscope's default: vLLM's execute_… and 'step …')")
            return parser
