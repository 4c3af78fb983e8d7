"""`stepscope export`: Chrome-trace JSON that Perfetto opens; kernels counted against the analyzer."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter, defaultdict

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.analysis.inventory import analyze_trace
from stepscope.cli import app
from stepscope.ingest import read_trace
from stepscope.render.perfetto import DEVICE_PID_BASE, export_document
from tests import kineto_fake
from tests.conftest import EXTERNAL, FIXTURES, need, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
TRACES = [p for p in (EAGER, FIXTURES / "llama8b_decode_b1_graph.sqlite",
                      FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite", EXTERNAL / "nsysai_mfu_2gpu_before.sqlite",
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
    check_tracks(doc)
    return Counter(e.get("cat") for e in doc["traceEvents"] if e["ph"] == "X")


def _ns(us: float) -> int:
    return round(us * 1000)  # the exporter's µs carry whole ns in their fraction


def check_tracks(doc: dict) -> None:
    """What Perfetto needs to keep every slice: on each (pid, tid) track the slices nest or follow
    each other (a partial overlap is dropped); every track has a name; every flow starts at a
    launch call's start and ends at a GPU activity's start, on the track that holds them."""
    tracks = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), e["cat"]))
    named = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(tracks) <= named
    for key, slices in tracks.items():
        open_ends: list[int] = []
        for start, end, _ in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"partial overlap on {key} at {start} ns"
            open_ends.append(end)
    starts = {(k, s, c == "launch") for k, sl in tracks.items() for s, _, c in sl}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            assert ((e["pid"], e["tid"]), _ns(e["ts"]), e["ph"] == "s") in starts, e


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


def test_overlapping_kernels_of_a_stream_get_a_lane_of_their_own(tmp_path):
    """In the eager decode step every split-K GEMM's splitKreduce starts before the GEMM ends
    (SQL below); none of those kernels is dropped, each sits on stream 7's overlap lane."""
    overlapping = ro(need(EAGER)).execute("""
        WITH k AS (SELECT start, LAG(end) OVER (PARTITION BY deviceId, streamId ORDER BY start) AS prev_end
                   FROM CUPTI_ACTIVITY_KIND_KERNEL)
        SELECT count(*) FROM k WHERE start < prev_end""").fetchone()[0]
    assert overlapping == 54
    out = tmp_path / "step.json"
    assert CliRunner().invoke(app, ["export", str(EAGER), "-o", str(out)]).exit_code == 0
    doc = json.loads(out.read_text())
    check_tracks(doc)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] >= DEVICE_PID_BASE}
    assert sorted(names.values()) == ["stream 7", "stream 7 (overlap 1)"]
    lane1 = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= DEVICE_PID_BASE
             and names[e["tid"]] == "stream 7 (overlap 1)"]
    assert len(lane1) == overlapping and {e["name"] for e in lane1} == {"splitKreduce_kernel"}
    # each lane-1 kernel keeps its flow from the launch call
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "f" and e["tid"] == lane1[0]["tid"]) == overlapping


def test_gzip_output(tmp_path):
    plain, packed = tmp_path / "step.json", tmp_path / "step.json.gz"
    for out in (plain, packed):
        r = CliRunner().invoke(app, ["export", str(need(EAGER)), "-o", str(out)])
        assert r.exit_code == 0, r.output
    raw = packed.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw) == plain.read_bytes()
    assert len(raw) < plain.stat().st_size / 5
    CliRunner().invoke(app, ["export", str(EAGER), "-o", str(packed)])
    assert packed.read_bytes() == raw  # no timestamp in the gzip header: the same bytes again


def _canonical(doc: dict) -> tuple:
    """The events as a multiset, flows paired without their ids (an id numbers the flows in
    activity order, which ties in start time may permute), and the document's other keys."""
    from collections import Counter as C

    evs, flows = [], defaultdict(dict)
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows[e["id"]][e["ph"]] = json.dumps({k: v for k, v in e.items() if k != "id"}, sort_keys=True)
        else:
            evs.append(json.dumps(e, sort_keys=True))
    pairs = [(f.get("s"), f.get("f")) for f in flows.values()]
    return C(evs), C(pairs), {k: v for k, v in doc.items() if k != "traceEvents"}


ORACLE_TRACES = TRACES + [p for p in (FIXTURES / "vllm" / "llama8b_decode_b1_graph.sqlite",
                                      FIXTURES / "round5" / "llama1b_decode_3steps_nonvtx.sqlite",
                                      FIXTURES / "llama8b_prefill_b1_eager.sqlite") if p.exists()]


@pytest.mark.parametrize("path", ORACLE_TRACES, ids=[p.name for p in ORACLE_TRACES])
def test_vectorized_export_equals_the_per_event_one(path):
    """The export is built a column at a time; the exporter it replaced (one dict per event,
    tests/perfetto_reference.py) is the oracle: the same events, lanes and flows on every trace."""
    from tests.perfetto_reference import reference_export_document

    inv = analyze_trace(read_trace(path))
    for ids in (inv.step_ids(), inv.step_ids()[:1], inv.step_ids()[-2:]):
        assert _canonical(export_document(inv, ids)) == _canonical(reference_export_document(inv, ids))


@pytest.mark.parametrize("path", ORACLE_TRACES, ids=[p.name for p in ORACLE_TRACES])
def test_the_export_commands_lean_inventory_writes_the_same(path, monkeypatch):
    """`export` reads the trace without grid/block and keeps only the columns it writes
    (memory.EXPORT); the grid/block are read while writing, joined a chunk at a time: the same
    document as the oracle's from the whole inventory, with chunks small enough to cut steps."""
    from stepscope import library
    from stepscope.analysis.memory import EXPORT
    from stepscope.render import perfetto
    from tests.perfetto_reference import reference_export_document

    full = analyze_trace(read_trace(path))
    lean = library.load(path, memory=EXPORT, cache=False)
    assert lean.trace.format != "nsys-sqlite" or "grid_x" not in lean.acts.columns
    monkeypatch.setattr(perfetto, "CHUNK_ROWS", 97)
    for ids in (lean.step_ids(), lean.step_ids()[-2:]):
        assert _canonical(export_document(lean, ids)) == _canonical(reference_export_document(full, ids))


def test_export_without_packed_launch_keys_writes_the_same():
    """Launches are joined on pid and correlation id packed into one integer where they fit;
    where one does not (ids above 2^40 here), on the two columns: the same document either way."""
    from stepscope.render import perfetto
    from tests.perfetto_reference import reference_export_document

    inv = analyze_trace(read_trace(EAGER))
    assert perfetto._launch_key(inv.acts) is not None
    ids = inv.step_ids()[:2]
    for frame in ("acts", "api", "launch_calls"):  # every frame that holds the ids, consistently
        setattr(inv, frame, getattr(inv, frame).with_columns(pl.col("corr") + (1 << 41)))
    assert perfetto._launch_key(inv.acts) is None
    assert _canonical(export_document(inv, ids)) == _canonical(reference_export_document(inv, ids))


def test_run_lanes_equal_lanes_on_random_tracks():
    """_run_lanes (lane 0 for a lone slice, 0/1 for a pair, lanes() for longer runs) against
    lanes() over whole tracks, on tracks with many overlaps of every depth."""
    import random

    from stepscope.render.perfetto import _run_lanes, lanes

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(0, 60)
        rows = sorted(((rng.randint(0, 3), rng.randint(0, 1)), s := rng.randint(0, 500),
                       s + rng.choice([0, 1, 5, 20, 80, 300])) for _ in range(n))
        rows.sort(key=lambda r: r[1])
        frame = pl.DataFrame({"device": [r[0][0] for r in rows], "stream": [r[0][1] for r in rows],
                              "start": [r[1] for r in rows], "end": [r[2] for r in rows]},
                             schema={"device": pl.Int32, "stream": pl.Int32, "start": pl.Int64, "end": pl.Int64})
        got = _run_lanes(frame, ["device", "stream"], "start", "end").to_list()
        want = [0] * n
        for key in {r[0] for r in rows}:
            idx = [i for i, r in enumerate(rows) if r[0] == key]
            for i, ln in zip(idx, lanes([rows[i][1] for i in idx], [rows[i][2] for i in idx])):
                want[i] = ln
        assert got == want
        # tracks on one packed integer where the keys fit; on the two keys where not (a negative
        # device here) or where a stream is null (its own track of its device): the same lanes
        shifted = frame.with_columns(pl.col("device") - 5)
        assert _run_lanes(shifted, ["device", "stream"], "start", "end").to_list() == want
        if n:
            nulled = frame.with_columns(pl.when(pl.col("stream") == 1).then(None).otherwise(pl.col("stream")).alias("stream"))
            assert (_run_lanes(nulled, ["device", "stream"], "start", "end").to_list()
                    == _run_lanes(nulled.with_columns(pl.col("device") - 5), ["device", "stream"], "start", "end").to_list())


def test_microsecond_text_is_pythons_repr():
    """Every timestamp and duration is written as json.dumps writes (ns - t0) / 1000.0: the
    float's shortest round-trip repr, on a million values of every magnitude and sign."""
    import numpy as np

    from stepscope.render.perfetto import _us_text

    rng = np.random.default_rng(7)
    ns = np.concatenate([rng.integers(-10**6, 10**13, 1_000_000), rng.integers(0, 1000, 2000),
                         [0, 1, 999, 1000, 1706745, 2**53 + 1, 10**18, -1]])
    got = pl.DataFrame({"ns": ns}).select(_us_text(pl.col("ns")))[:, 0].to_list()
    # json.dumps of the whole list writes each float as json.dumps(float) does (one C call instead
    # of a million); a float's text holds no ", ", so the split gives back each value's text
    assert got == json.dumps([n / 1000.0 for n in ns.tolist()])[1:-1].split(", ")
