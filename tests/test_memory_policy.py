"""What each command keeps in memory (analysis/memory.py), checked against the exports themselves:
the trace's event frames read again on demand (NOTEBOOK), one step's grid/block read for it alone
(Inventory.step_acts), the export's narrowed activities, compare's one-shot sides."""

from __future__ import annotations

import os
import shutil

import polars as pl
import pytest

from stepscope import library
from stepscope.analysis.memory import EXPORT, EXPORT_ACT_COLUMNS, KEEP, NOTEBOOK, ONE_SHOT
from stepscope.api import open_trace
from stepscope.errors import InputError
from tests.conftest import FIXTURES, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
DIMS = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def _sql_dims(path, lo: int, hi: int, device: int) -> set[tuple]:
    """(pid, corr, start, grid, block) of the kernels of `device` that started from lo to hi."""
    rows = ro(path).execute(
        "SELECT (globalPid >> 24) & 16777215, correlationId, start, gridX, gridY, gridZ, blockX, blockY, blockZ "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ? AND start BETWEEN ? AND ?", (device, lo, hi)).fetchall()
    return set(rows)


def test_notebook_reads_the_event_frames_again_when_asked(tmp_path):
    """open_trace lets the trace's kernel, memop and API frames go once the activities hold their
    rows; Trace.read_events() reads them again from the file, as many rows as the export has (an
    attribute access reads nothing, and says how)."""
    path = tmp_path / EAGER.name
    shutil.copy(EAGER, path)
    con = ro(path)
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    a = open_trace(path, cache=False)
    assert not {"kernels", "memops", "api"} & set(a.trace.__dict__)
    with pytest.raises(AttributeError, match="read_events"):
        a.trace.kernels  # noqa: B018
    assert a.trace.read_events().kernels.height == kernels  # read again, once: every frame is back
    assert {"kernels", "memops", "api"} <= set(a.trace.__dict__)
    assert a.inventory.acts.filter(pl.col("is_kernel")).height == kernels
    # NOTEBOOK keeps the synchronizing calls only; the launch calls are in launch_calls
    assert a.inventory.api["is_sync"].all() and a.inventory.launch_calls.height > 0


def test_a_trace_changed_since_its_analysis_is_not_read_again(tmp_path):
    path = tmp_path / EAGER.name
    shutil.copy(EAGER, path)
    a = open_trace(path, cache=False)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(InputError, match="changed since it was analyzed"):
        a.trace.read_events()


@pytest.mark.parametrize("path", [EAGER, GRAPH, TP2], ids=lambda p: p.name)
def test_step_acts_read_one_steps_grid_and_block_from_the_export(path):
    """A trace read without grid/block (every command but export) gets a step's from the export:
    each kernel's equals its row in the export (plain SQL), memops have none."""
    inv = library.load(path, cache=False)
    assert "grid_x" not in inv.acts.columns
    for step in inv.step_ids()[:3]:
        a = inv.step_acts(step)
        k = a.filter(pl.col("is_kernel"))
        assert k.height == inv.acts.filter((pl.col("step") == step) & pl.col("is_kernel")).height > 0
        want = set()
        for (d,), g in k.group_by("device"):
            want |= _sql_dims(path, g["start"].min(), g["start"].max(), d)
        got = list(k.select("pid", "corr", "start", *DIMS).iter_rows())
        assert len(set(got)) == len(got) and set(got) <= want and k["grid_x"].null_count() == 0
        assert a.filter(~pl.col("is_kernel")).select(pl.all_horizontal(pl.col(DIMS).is_null())).to_series().all()


def test_step_acts_equal_a_read_with_grid_and_block():
    full = library.load(EAGER, launch_config=True, memory=KEEP, cache=False)
    lean = library.load(EAGER, cache=False)
    for step in full.step_ids():
        cols = ["pid", "corr", "start", "is_kernel", *DIMS]
        assert lean.step_acts(step).select(cols).equals(full.step_acts(step).select(cols))


def test_step_acts_without_a_reader_are_null_not_wrong():
    inv = library.load(EAGER, cache=False)
    inv.launch_config = None
    a = inv.step_acts(inv.step_ids()[0])
    assert a.height and a.select(pl.all_horizontal(pl.col(DIMS).is_null())).to_series().all()


def test_export_keeps_only_what_it_writes():
    inv = library.load(EAGER, memory=EXPORT, cache=False)
    assert set(inv.acts.columns) <= set(EXPORT_ACT_COLUMNS)
    assert inv.launch_calls.height == 0 and inv.api["is_sync"].all()
    from stepscope.render.perfetto import EXPORT_COLUMNS

    assert set(EXPORT_COLUMNS) <= set(inv.acts.columns)


@pytest.mark.parametrize("path", [EAGER, GRAPH], ids=lambda p: p.name)
def test_compare_reads_each_side_once_and_says_the_same(path):
    """compare lets each side's events go (ONE_SHOT) before reading the other; its document is
    the one the kept analyses give, the graph prediction (read off graph_steps) included."""
    from stepscope.analysis.compare import compare as compared

    doc = library.compare(path, GRAPH, cache=False)
    kept = [library.diagnosis(p, cache=False, memory=KEEP) for p in (path, GRAPH)]
    want = compared(*kept)
    assert {k: doc[k] for k in want if k not in ("a", "b")} == {k: want[k] for k in want if k not in ("a", "b")}
    for side in ("a", "b"):
        assert {k: v for k, v in doc[side].items() if k != "untraced_source"} == \
            {k: v for k, v in want[side].items() if k != "untraced_source"}
    lean = library.diagnosis(path, cache=False, memory=ONE_SHOT)
    ONE_SHOT.results_ready(lean)
    assert lean.inv.acts.height == 0 and lean.inv.graph_steps.equals(kept[0].inv.graph_steps)


def test_graph_steps_are_the_steps_with_graph_nodes():
    inv = library.load(GRAPH, cache=False, memory=NOTEBOOK)
    want = sorted({r[0] for r in inv.acts.filter(pl.col("graph_node_id").is_not_null()
                                                 & pl.col("step").is_not_null()).select("step").iter_rows()})
    assert inv.graph_steps["step"].to_list() == want and want
    nodes = ro(GRAPH).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL").fetchone()[0]
    assert inv.acts.filter(pl.col("graph_node_id").is_not_null()).height == nodes > 0
    assert library.load(EAGER, cache=False).graph_steps.height == 0


def test_a_narrowed_read_that_misses_a_kernel_is_read_again_whole(monkeypatch):
    """A step's grid/block are read among the rows the bisection over the rowid points at; where
    the export's rows are out of start order some are missed, and the step is read again whole:
    the same grid/block either way."""
    from stepscope import launch_config

    full = library.load(TP2, launch_config=True, memory=KEEP, cache=False)
    lean = library.load(TP2, cache=False)
    step = lean.step_ids()[1]
    cols = ["pid", "corr", "start", "is_kernel", *DIMS]
    want = full.step_acts(step).select(cols)
    assert lean.step_acts(step).select(cols).equals(want)
    reads = []
    monkeypatch.setattr(launch_config, "rows_near", lambda con, table, lo, hi: reads.append(lo) or (1, 1))
    assert lean.step_acts(step).select(cols).equals(want) and reads  # one row read first: all missed


def test_rows_near_holds_every_kernel_of_a_window():
    from stepscope.launch_config import rows_near

    con = ro(EAGER)
    starts = [r[0] for r in con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")]
    for lo, hi in ((starts[0], starts[10]), (starts[200], starts[260]), (starts[-5], starts[-1])):
        a, b = rows_near(con, "CUPTI_ACTIVITY_KIND_KERNEL", lo, hi)
        inside = con.execute("SELECT min(rowid), max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                             "WHERE start BETWEEN ? AND ?", (lo, hi)).fetchone()
        assert a <= inside[0] and inside[1] <= b


@pytest.mark.parametrize("path", [EAGER, TP2], ids=lambda p: p.name)
def test_grid_and_block_of_an_export_whose_rows_are_out_of_order(tmp_path, path):
    """The kernel rows in random order: the bisection's rows are then no step's, every step is
    read again whole, and each step's grid/block, the budget's input and the export are still
    those of a read with grid/block."""
    import sqlite3

    from stepscope.render.perfetto import export_document

    copy = tmp_path / path.name
    shutil.copy(path, copy)
    con = sqlite3.connect(copy)
    con.execute("CREATE TABLE shuffled AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY random()")
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM shuffled")
    con.execute("DROP TABLE shuffled")
    con.commit()
    first = [r[0] for r in con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 50")]
    con.close()
    assert first != sorted(first)
    full = library.load(copy, launch_config=True, memory=KEEP, cache=False)
    lean = library.load(copy, cache=False)
    cols = ["pid", "corr", "start", "is_kernel", *DIMS]
    for step in lean.step_ids():
        assert lean.step_acts(step).select(cols).equals(full.step_acts(step).select(cols))
    ids = full.step_ids()[:2]
    assert export_document(library.load(copy, memory=EXPORT, cache=False), ids) == export_document(full, ids)


def test_a_changed_export_gives_no_grid_and_block(tmp_path):
    """A step's grid/block are read after the analysis: from the same file, or not at all."""
    path = tmp_path / EAGER.name
    shutil.copy(EAGER, path)
    inv = library.load(path, cache=False)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(InputError, match="changed since it was analyzed"):
        inv.step_acts(inv.step_ids()[0])
