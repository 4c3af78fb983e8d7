"""Two serving runs compared by matched steps (analysis/run_compare.py) in the reports: one
table per kind and over the run, for `report --compare` in HTML and Markdown."""

from __future__ import annotations

from html import escape

from stepscope.render.sentences import runs_sentence
from stepscope.render.units import MISSING, ms_num, signed_percent, times


def runs_table(r: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per kind, then the run; times bare under a header in ms."""
    what_if = "predicted_graph_time_ns" in r["run"]
    head = ["kind", "pairs", "Σ A ms", "Σ B ms", "speedup"] + (["A with graphs ms", "off by"] if what_if else [])

    def row(label: str, k: dict) -> list[str]:
        cells = [label, str(k["pairs"]), ms_num(k["a_time_ns"]), ms_num(k["b_time_ns"]),
                 times(k["speedup"]) if k["speedup"] else MISSING]
        if what_if:
            cells += [ms_num(k.get("predicted_graph_time_ns")), signed_percent(k.get("prediction_error"))]
        return cells

    return head, [row(k["kind"], k) for k in r["kinds"]] + [row("the run (matched steps)", r["run"])]


def runs_compare_html(r: dict) -> str:
    head, rows = runs_table(r)
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<p>{escape(runs_sentence(r))}</p><table id="runs-compare"><tr>{th}</tr>{trs}</table>'


def runs_compare_markdown(r: dict, table) -> list[str]:
    """Markdown lines; `table`: markdown.py's table builder."""
    head, rows = runs_table(r)
    return [runs_sentence(r), "", table(head, rows), ""]
