"""How an Analysis and a Step show in a notebook: a readable repr, and an HTML table for
Jupyter's `_repr_html_` (the units of render/units.py, as the terminal and the reports)."""

from __future__ import annotations

from html import escape

import polars as pl

from stepscope.render.units import ms, plural, us

SHOWN_STEPS = 20  # rows of the notebook table; the rest is said in one line


def _verdict(fig: dict) -> str:
    out = f"{fig.get('phase') or 'phase unknown'} step, {fig.get('verdict') or 'no verdict'} ({ms(fig['step_time_ns'])}"
    pred = fig.get("predicted_graph_step_time_ns")
    if fig.get("verdict") == "launch-bound" and pred is not None and pred < fig["step_time_ns"]:
        out += f"; CUDA graphs: about {ms(pred)}"
    return out + ")"


def step_repr(fig: dict) -> str:
    return f"<stepscope.Step {fig['index']}: {_verdict(fig)}, {fig['n_kernels']} kernels>"


def analysis_repr(name: str, table: pl.DataFrame, verdicts: list[tuple]) -> str:
    """`verdicts`: (verdict, steps) pairs, most steps first (api.Analysis counts them)."""
    n = table.height
    head = f"<stepscope.Analysis of {name}: {n} step{'s' if n != 1 else ''}"
    if not n:
        return head + ">"
    split = ", ".join(f"{c} {v}" for v, c in verdicts)
    return f"{head} ({split}); step {table['index'][0]}: {_verdict(table.row(0, named=True))}>"


COLUMNS = (("step", "index", str), ("phase", "phase", lambda v: v or "–"), ("step time", "step_time_ns", ms),
           ("GPU busy", "gpu_busy_ns", ms), ("kernels", "n_kernels", str), ("launch calls", "n_launch_calls", str),
           ("host per launch", "t_launch_ns", us), ("CPU floor", "cpu_floor_ns", ms),
           ("device floor", "device_floor_ns", ms), ("verdict", "verdict", lambda v: v or "–"),
           ("CUDA-graph step", "predicted_graph_step_time_ns", ms),
           ("untraced", "untraced_step_time_ns", ms))


def analysis_html(name: str, table: pl.DataFrame, warnings: list[str], defects: list[str] = ()) -> str:
    head = "".join(f"<th>{escape(label)}</th>" for label, _, _ in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{escape(fmt(r.get(col)))}</td>" for _, col, fmt in COLUMNS) + "</tr>"
                   for r in table.head(SHOWN_STEPS).iter_rows(named=True))
    more = (f"<p>… and {table.height - SHOWN_STEPS} more steps (Analysis.table has them all)</p>"
            if table.height > SHOWN_STEPS else "")
    warn = "".join(f"<p>warning: {escape(w)}</p>" for w in warnings)
    # the capture's own defects come before the steps read from it
    capture = "".join(f"<p><b>capture:</b> {escape(d)}</p>" for d in defects)
    return (f"<div><b>stepscope</b> · {escape(name)} · {plural(table.height, 'step')}{capture}"
            f"<table><tr>{head}</tr>{rows}</table>{more}{warn}</div>")


def step_html(fig: dict, classes: pl.DataFrame) -> str:
    total = classes["time_ns"].sum() or 1
    rows = "".join(f"<tr><td>{escape(str(r['class']))}</td><td>{r['count']}</td><td>{us(r['time_ns'])}</td>"
                   f"<td>{100 * r['time_ns'] / total:.1f}%</td></tr>" for r in classes.iter_rows(named=True))
    return (f"<div><b>step {fig['index']}</b>: {escape(_verdict(fig))}"
            f"<table><tr><th>class</th><th>count</th><th>time</th><th>share</th></tr>{rows}</table></div>")
