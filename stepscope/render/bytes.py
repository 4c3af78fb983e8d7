"""The byte side on the terminal and as JSON: `budget`'s table and `cells show`'s ledger."""

from __future__ import annotations

import json


def budget_json(doc: dict) -> str:
    """`budget --json`: the document as it has always been printed (indent 1, str() for the rest)."""
    return json.dumps(doc, indent=1, default=str)


def render_budget(doc) -> None:
    """`budget` on the terminal: the per-class and per-op table, how the kernels joined, and the
    kernels without a cell."""
    from stepscope.render.console import Col, fitted, page, plural
    from stepscope.render.names import term
    from stepscope.render.units import MISSING, nbytes, us_num

    con = page()
    for r in doc.get("verdict_block") or ():  # render/headline.py's rows, as analyze opens with them
        con.print(f"[bold]{term(r['label'])}:[/] {term(r['text'], 2000)}")
    st = doc["step"]
    # (class, op) tells a row apart: neither is ever cut; under a width the class becomes a
    # header row above its ops and the least needed figures go (bytes in a cell keep their unit:
    # a step's byte figures span 4 B to 15 GB)
    cols = [Col("class", "left", group=True, drop=3), Col("op", "left"), Col("calls"),
            Col("bytes/call", drop=5), Col("measured"), Col("minimum", drop=2), Col("ampl.", drop=4),
            Col("removable"), Col("floor µs", drop=5), Col("time µs")]
    rows = []
    for r in doc["rows"]:
        amp = r["amplification"]
        rows.append([term(r["class"]), term(r["op"]) if r["op"] else "[dim](no cell)[/]", str(r["calls"]),
                     nbytes(r["measured_bytes_per_call"]), nbytes(r["measured_bytes"]), nbytes(r["min_bytes"]),
                     f"{amp:.2f}" if amp is not None else MISSING, nbytes(r["removable_bytes"]),
                     us_num(r["floor_ns"]), us_num(r["time_ns"])])
    rows.append(["", "[bold]step[/]", str(st["calls"]), "", nbytes(st["measured_bytes"]), nbytes(st["min_bytes"]),
                 f"{st['amplification']:.2f}" if st["amplification"] else MISSING, nbytes(st["removable_bytes"]),
                 us_num(st["floor_ns"]), us_num(st["time_ns"])])
    title = (f"HBM byte budget — step {doc['step_index']} ({term(st['phase'])}, batch {st['batch']}, context "
             f"{st['context']}, {term(doc['model'])}) on {term(doc['gpu'] or '?')}")
    t = fitted(con.width, cols, rows, title=title, total=True)
    con.print(t)
    ranked = [c for c in doc["classes"] if c["removable_bytes"] is not None]
    if ranked:
        con.print("classes by removable bytes: " + ", ".join(
            f"{term(c['class'])} {nbytes(c['removable_bytes'])}" for c in ranked[:5]))
    j = st["joined"]
    if j.get("order"):
        o = st["order"]
        con.print(f"joined by launch order: {j['order']} of the step's {o['step_kernels']} kernels to the "
                  f"{o['profiled_kernels']} profiled kernels of the step's own ncu run, checked by name; "
                  f"{j.get('trace', 0)} memops by their trace bytes")
    else:
        con.print(f"joined: {j['launch']} calls by kernel+grid+block, {j['name']} by name only, "
                  f"{j['op']} by op, {j.get('trace', 0)} memops by their trace bytes; "
                  f"{plural(len(st['unjoined_kernels']), 'kernel')} without a cell")
    if st.get("unjoined_min_bytes"):
        ops = f" (ops no kernel joined: {', '.join(st['unjoined_ops'])})" if st.get("unjoined_ops") else ""
        con.print(f"minimum over the joined kernels: {nbytes(st['min_bytes'])}; the step's calls no kernel "
                  f"joined{ops} add {nbytes(st['unjoined_min_bytes'])} to the step's {nbytes(st['plan_min_bytes'])}")
    below = [r for r in doc["rows"] if r.get("note") is not None]
    if below:
        con.print("below their minimum (DRAM bytes only: inputs the previous kernel left in L2 were read "
                  "from L2, outputs still in the write-back L2 at the kernel's end are not counted; ncu's "
                  "hit rate exceeds 100 % on tiny kernels and is shown as 100): "
                  + ", ".join(f"{r['op'] or r['class']} ({r['note'].split(': ', 1)[-1]})"
                              for r in below))
    for u in st["unjoined_kernels"][:15]:
        con.print(f"  [yellow]no cell[/] {term(u['class']):<16} {u['count']:>4}× {term(u['name'])}"
                  + (f" [dim]({term(u['reason'])})[/]" if u.get("reason") else ""))
    for n in doc.get("notes", []):
        con.print(term(n, 2000), highlight=False)
    for w in doc.get("warnings", []):
        con.print(f"[yellow]warning:[/] {term(w, 2000)}")


def cells_document(led, gpus, peak) -> dict:
    """`cells show --json`: the ledger's rows with the GPUs and their peak bandwidth."""
    keep = ["cell", "op", "proj", "tokens", "launch", "kernel", "grid", "block",
            "dram_read_bytes", "dram_write_bytes", "dram_bytes", "duration_ns", "l2_hit_pct",
            "achieved_bps", "cell_min_bytes", "amplification", "matched", "error", "gpu"]
    rows = led.select([c for c in keep if c in led.columns]).to_dicts()
    return {"gpus": gpus, "peak_hbm_bps": peak, "cells": rows}


def cells_json(led, gpus, peak) -> str:
    """`cells show --json`."""
    return json.dumps(cells_document(led, gpus, peak), indent=1)


def render_cells(led, gpus, peak) -> None:
    """`cells show` on the terminal: the ledger of each profiled launch, one line each. A row is
    told by its cell and launch number, never cut; the kernel's short name gets the width left,
    the least needed figures go under a width (all in --json)."""
    from stepscope.render.console import Col, fitted, page, plural
    from stepscope.render.names import short, term
    from stepscope.render.units import MISSING, nbytes, us_num

    con = page()
    cols = [Col("cell", "left"), Col("#"), Col("kernel", "left", flex=True, min=16), Col("grid", "left", drop=3),
            Col("read"), Col("write"), Col("min (cell)", drop=2), Col("ampl.", drop=2), Col("L2 hit", drop=4),
            Col("time µs"), Col("GB/s", drop=1)]
    rows, errors, unmatched = [], [], 0
    for r in led.iter_rows(named=True):
        if r.get("error"):
            errors.append(r)
            continue
        amp = r.get("amplification")
        mark = ""
        if r.get("matched") is False:
            mark, unmatched = "* ", unmatched + 1
        rows.append([
            term(r.get("cell") or ""), "" if r.get("launch") is None else str(r["launch"]),
            mark + term(short(r.get("kernel") or "")), term(r.get("grid") or ""), nbytes(r.get("dram_read_bytes")),
            nbytes(r.get("dram_write_bytes")), nbytes(r.get("cell_min_bytes")),
            f"{amp:.2f}" if amp is not None and r.get("launch") in (0, None) else "",
            f"{r['l2_hit_pct']:.1f}%" if r.get("l2_hit_pct") is not None else MISSING,
            us_num(r.get("duration_ns")),
            f"{r['achieved_bps'] / 1e9:.0f}" if r.get("achieved_bps") is not None else MISSING,
        ])
    title = (f"byte cells — {term(', '.join(gpus)) or 'GPU unknown'}"
             + (f" (peak {peak / 1e12:.2f} TB/s)" if peak else ""))
    con.print(fitted(con.width, cols, rows, title=title))
    if unmatched:
        con.print(f"* {plural(unmatched, 'kernel')} not matched by their op's regex")
    for r in errors:
        con.print(f"[red]error[/] {term(r.get('cell') or '?')}: {term(r['error'], 2000)}")
