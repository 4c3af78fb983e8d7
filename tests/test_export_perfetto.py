"""`stepscope export`: Chrome-trace JSON that Perfetto opens; kernels counted against the analyzer."""

from __future__ import annotations

import json
import os
from collections import Counter

import polars as pl
import pytest
from typer.testing import CliRunner

from stepscope.analysis.inventory import analyze_trace
from stepscope.cli import app
from stepscope.ingest import read_trace
from stepscope.render.perfetto import DEVICE_PID_BASE, export_document
from tests import kineto_fake
from tests.conftest import EXTERNAL, FIXTURES

TRACES = [p for p in (FIXTURES / "llama8b_decode_b1_eager.sqlite", EXTERNAL / "nsysai_mfu_2gpu_before.sqlite",
                      EXTERNAL / "pipit_cloverleaf.sqlite") if p.exists()]


def check_schema(doc: dict) -> Counter:
    """Every event has ph/ts/pid/tid; X events have dur >= 0; flows pair up (one s, one f per id)."""
    assert isinstance(doc["traceEvents"], list)
    flows: dict = {}
    for e in doc["traceEvents"]:
        for key in ("ph", "ts", "pid", "tid"):
            assert key in e, (key, e)
        assert isinstance(e["ts"], (int, float))
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            assert e["ts"] >= 0, e
            assert isinstance(e["name"], str) and isinstance(e["cat"], str)
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], []).append(e)
    for fid, pair in flows.items():
        assert sorted(x["ph"] for x in pair) == ["f", "s"], fid
        s = next(x for x in pair if x["ph"] == "s")
        f = next(x for x in pair if x["ph"] == "f")
        assert f["bp"] == "e" and f["pid"] >= DEVICE_PID_BASE and s["pid"] < DEVICE_PID_BASE
    return Counter(e.get("cat") for e in doc["traceEvents"] if e["ph"] == "X")


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_export_schema_and_kernel_count(tmp_path, path):
    inv = analyze_trace(read_trace(path))
    ids = inv.step_ids()[:3]
    out = tmp_path / "step.json"
    r = CliRunner().invoke(app, ["export", str(path), "-o", str(out), "--steps", f"{ids[0]}-{ids[-1]}"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    cats = check_schema(doc)
    want = inv.steps.filter(inv.steps["step"].is_in(ids))
    n_kernels = sum(n for c, n in cats.items() if c not in ("launch", "step", "memops"))
    assert n_kernels == want["n_kernels"].sum()
    # the class of every kernel is its category, as the analyzer counted them
    by_class = inv.classes.filter(inv.classes["step"].is_in(ids)).group_by("class").agg(n=pl.col("count").sum())
    assert {c: n for c, n in by_class.iter_rows()} == {c: n for c, n in cats.items() if c not in ("launch", "step")}
    # one flow per GPU activity whose launching call is in the trace
    launched = inv.acts.filter(inv.acts["step"].is_in(ids) & inv.acts["launch_start"].is_not_null()).height
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "s") == launched
    # tracks: a process per device, a thread per stream, named
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    streams = {(DEVICE_PID_BASE + d, s) for d, s in want.join(inv.acts.select("step", "device", "stream").unique(), on=["step", "device"]).select("device", "stream").unique().iter_rows()}
    assert streams <= set(names)


def test_export_kineto_trace(tmp_path):
    path = kineto_fake.write(tmp_path / "t.json.gz")
    inv = analyze_trace(read_trace(path), r"^ProfilerStep#\d+$")
    doc = export_document(inv, [1])
    cats = check_schema(doc)
    assert sum(n for c, n in cats.items() if c not in ("launch", "step", "memops")) == 4
    assert cats["memops"] == 1 and cats["launch"] == 5 and cats["step"] == 1


def test_export_bad_steps_and_unwritable_output(tmp_path):
    path = kineto_fake.write(tmp_path / "t.json")
    r = CliRunner().invoke(app, ["export", str(path), "-o", str(tmp_path / "x.json"), "--steps", "banana",
                                 "--step-regex", r"^ProfilerStep#\d+$"])
    assert r.exit_code != 0 and "--steps" in r.output
    r = CliRunner().invoke(app, ["export", str(path), "-o", str(tmp_path / "nodir" / "x.json"),
                                 "--step-regex", r"^ProfilerStep#\d+$"])
    assert r.exit_code != 0 and "does not exist" in r.output
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = CliRunner().invoke(app, ["export", str(path), "-o", str(afile / "x.json"), "--step-regex", r"^ProfilerStep#\d+$"])
    assert r.exit_code != 0 and "not a folder" in r.output


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    """A write that fails midway (full disk, permission) leaves neither the file nor a temp file."""
    path = kineto_fake.write(tmp_path / "t.json")
    out = tmp_path / "out"
    out.mkdir()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    r = CliRunner().invoke(app, ["export", str(path), "-o", str(out / "x.json"), "--step-regex", r"^ProfilerStep#\d+$"])
    assert r.exit_code != 0
    assert "cannot write" in r.output and "No space left" in r.output and r.output.count("\n") == 1
    assert list(out.iterdir()) == []


def test_read_only_folder(tmp_path):
    path = kineto_fake.write(tmp_path / "t.json")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        if os.access(ro, os.W_OK):  # root ignores permissions
            pytest.skip("running as root: a read-only folder is still writable")
        r = CliRunner().invoke(app, ["export", str(path), "-o", str(ro / "x.json"), "--step-regex", r"^ProfilerStep#\d+$"])
        assert r.exit_code != 0 and "cannot write" in r.output
        assert list(ro.iterdir()) == []
    finally:
        os.chmod(ro, 0o755)
