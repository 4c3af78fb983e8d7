"""The capture's own defects (analysis/capture_check.py, docs/SERVING.md): found on the real
`vllm serve` captures of fixtures/vllm_serve/ and the plain model runs of fixtures/models/,
each figure checked against plain SQL over the same export."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from stepscope.api import open_trace
from stepscope.cli import app
from stepscope.errors import InputError
from tests.conftest import FIXTURES, CliRunner, gunzipped, need, ro, sha256

SERVE = FIXTURES / "vllm_serve"
MODELS = FIXTURES / "models"
TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def run(*args):
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def _serve(kind: str):
    return gunzipped(need(SERVE / f"llama-3.1-8b_serve_{kind}.sqlite.gz"))


def _engine_pid(con) -> int:
    (pid,) = con.execute("SELECT DISTINCT globalPid / 16777216 % 16777216 FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    return pid


def _records_end(con, pid: int) -> int:
    """The end of the process's last CUDA record: API call, kernel, copy or set."""
    ends = []
    for t in TABLES:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone():
            continue
        col = "globalTid" if t == "CUPTI_ACTIVITY_KIND_RUNTIME" else "globalPid"
        ends.append(con.execute(f"SELECT max(end) FROM {t} WHERE {col} / 16777216 % 16777216 = ?", (pid,)).fetchone()[0])
    return max(e for e in ends if e is not None)


def _session(con) -> int:
    return con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]


def test_sigint_capture_is_named_start_up_only_and_truncated():
    """A plain capture stopped with SIGINT: the engine's CUDA records end 29.6 s before the
    session and hold start-up only. No step is made up (it gave 6,925 two-kernel "steps"):
    `analyze` says in one line, exit 2, where the records end, how much is missing, what the
    trace holds and how to capture instead, with the figures SQL finds."""
    src = _serve("sigint")
    con = ro(src)
    pid = _engine_pid(con)
    end, session = _records_end(con, pid), _session(con)
    runtime_end = con.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid / 16777216 % 16777216 = ?",
                              (pid,)).fetchone()[0]
    assert abs(end - runtime_end) < 1_000_000  # the last kernel ends just after the last call
    nvtx_end = con.execute("SELECT max(end) FROM NVTX_EVENTS WHERE globalTid / 16777216 % 16777216 = ?", (pid,)).fetchone()[0]
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    inductor = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                              WHERE s.value GLOB 'triton_poi_*' OR s.value GLOB 'triton_red_*'
                              OR s.value GLOB 'triton_per_*' OR s.value GLOB 'triton_tem_*'""").fetchone()[0]
    before = sha256(src)
    r = run("analyze", src, "--no-cache")
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "no engine step found" in line
    assert (f"the engine (pid {pid})'s CUDA records end at {end / 1e9:.1f} s, {(session - end) / 1e9:.1f} s before "
            f"the session ({session / 1e9:.1f} s)") in line
    assert "records end at 78.2 s, 29.6 s before the session (107.8 s)" in line  # the README's figures
    assert f"its NVTX ranges go on to {nvtx_end / 1e9:.1f} s" in line
    assert f"its last {(session - end) / 1e9:.1f} s are missing" in line
    assert f"its {kernels:,} kernels" in line and "start-up only" in line
    assert f"torch.compile: {inductor:,} Inductor kernels" in line
    assert "--capture-range=cudaProfilerApi" in line and "--cuda-flush-interval=1000" in line
    assert sha256(src) == before
    with pytest.raises(InputError, match="no engine step found"):
        open_trace(src, cache=False)


def _copy(src, tmp_path, name="t.sqlite"):
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    return dst


def _sql(path, *statements: str) -> None:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()


def test_partly_truncated_capture_keeps_its_steps_and_names_the_loss_first(tmp_path):
    """The flush capture with its engine's CUDA records after the middle of the traffic deleted
    and the session 20 s longer (what the MoE server's plain capture looked like: the records
    end 22 s early, part of the traffic kept): the steps before the cut are analyzed, and the
    loss is the first thing every output says, with the cut SQL finds."""
    path = _copy(_serve("flush"), tmp_path)
    con = ro(path)
    pid = _engine_pid(con)
    (last,) = con.execute("""SELECT max(k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                 JOIN StringIds s ON s.id = k.shortName
                                 WHERE s.value = '_prepare_pos_seq_lens_kernel'""").fetchone()
    con.close()
    cut = last - 1_000_000_000  # a second before the last iteration: inside the traffic
    _sql(path, *[f"DELETE FROM {t} WHERE start > {cut}" for t in TABLES],
         "UPDATE ANALYSIS_DETAILS SET duration = duration + 20000000000")
    con = ro(path)
    end, session = _records_end(con, pid), _session(con)
    assert session - end > 20e9
    marks = [x for x in (SERVE / "llama-3.1-8b_serve_flush.log").read_text(encoding="utf-8").splitlines()
             if x.startswith("capture_serve: {")]
    d = json.loads(marks[0][len("capture_serve: "):])
    traffic = int((d["t0_unix"] + d["marks"]["traffic_start"]) * 1e9) - con.execute(
        "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    kept = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                          WHERE s.value = '_prepare_pos_seq_lens_kernel' AND k.start > ?""", (traffic,)).fetchone()[0]
    a = open_trace(path, cache=False)
    assert kept > 10 and a.table.height == kept and (a.table["delimiter"] == "engine").all()
    (row,) = a.inventory.capture.filter(a.inventory.capture["kind"] == "truncated").to_dicts()
    assert row["pid"] == pid and row["records_end_ns"] == end and row["session_end_ns"] == session
    assert row["missing_ns"] == session - end
    assert a.inventory.capture["kind"].to_list()[0] == "truncated"
    r = run("analyze", path, "--no-cache")
    assert r.exit_code == 0, r.output
    body = r.output.replace("\n", " ")
    assert body.index("capture:") < body.index("engine start-up") < body.index("the run")
    assert f"{(session - end) / 1e9:.1f} s before the session" in body
    doc = json.loads(run("analyze", path, "--no-cache", "--json").stdout)
    assert list(doc).index("capture") < list(doc).index("warnings")
    assert doc["capture"][0]["kind"] == "truncated" and doc["capture"][0]["missing_ns"] == session - end


def test_flush_capture_is_whole_and_graph_level_rows_are_one_defect(tmp_path):
    """The capture that kept the engine's records (--cuda-flush-interval=1000): they end 2.4 s
    before the session, a clean exit's teardown, so nothing is missing; its graph-level rows are
    a defect, with the count SQL finds, shown once (not again as a warning) before the warnings
    in the terminal, in Markdown and in HTML; it has none of vLLM's ranges."""
    src = _serve("flush")
    con = ro(src)
    pid = _engine_pid(con)
    assert 0 < _session(con) - _records_end(con, pid) < 5e9
    graphs = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0]
    a = open_trace(src, cache=False)
    defects = a.inventory.capture
    assert defects["kind"].to_list() == ["graph_level", "no_nvtx"]
    assert f"each of the {graphs:,} graph launches is one GPU row (class cuda_graph)" in defects["text"][0]
    assert "--cuda-graph-trace=node" in defects["remedy"][0]
    assert f"pid {pid}" in defects["text"][1] and "vLLM's engine loop" in defects["text"][1]
    assert a.capture.equals(defects)  # the notebook's Analysis has them, and shows them before its steps
    html = a._repr_html_()
    assert html.index(f"the {graphs:,} graph launches") < html.index("<table>")
    assert "per-kernel inventory unavailable" not in html
    r = run("analyze", src, "--no-cache")
    assert r.exit_code == 0, r.output
    out = r.output.replace("\n", " ")
    assert out.index("capture:") < out.index("warning:")
    assert "per-kernel inventory unavailable" not in out
    doc = json.loads(run("analyze", src, "--no-cache", "--json").stdout)
    assert [d["kind"] for d in doc["capture"]] == ["graph_level", "no_nvtx"]
    assert any(w.startswith("per-kernel inventory unavailable for") for w in doc["warnings"])  # the reader's, kept
    for ext in ("md", "html"):
        out_path = tmp_path / f"r.{ext}"
        assert run("report", src, "-o", out_path).exit_code == 0
        text = out_path.read_text(encoding="utf-8")
        assert "capture" in text and f"the {graphs:,} graph launches" in text
        assert "per-kernel inventory unavailable" not in text
        verdict = "**Verdict**" if ext == "md" else 'id="verdict-block"'
        assert text.index(f"the {graphs:,} graph launches") < text.index(verdict)


def test_hooks_capture_has_no_defect():
    """The profiler-hook capture (a capture range, node-level rows, vLLM's step ranges): its
    records end with its session (SQL), and nothing is said about the capture."""
    src = _serve("hooks")
    con = ro(src)
    assert 0 <= _session(con) - _records_end(con, _engine_pid(con)) < 1e9
    a = open_trace(src, cache=False)
    assert a.inventory.capture.is_empty()
    assert "capture" not in a.to_dict()


@pytest.mark.parametrize("name", ["qwen3-30b-a3b_r32_graph_plain", "deepseek-v2-lite_r32_graph_plain"])
def test_plain_model_runs_are_whole_captures(name, tmp_path):
    """The plain whole-run captures end a few seconds before their session (the engine's clean
    teardown): no truncation; with vLLM's scheduler ranges nothing is said; with every NVTX row
    deleted, that there is no NVTX and the steps come from vLLM's engine loop."""
    src = gunzipped(need(MODELS / f"{name}.sqlite.gz"))
    con = ro(src)
    assert 0 < _session(con) - _records_end(con, _engine_pid(con)) < 10e9
    assert open_trace(src, cache=False).inventory.capture.is_empty()
    path = _copy(src, tmp_path)
    _sql(path, "DELETE FROM NVTX_EVENTS")
    (row,) = open_trace(path, cache=False).inventory.capture.to_dicts()
    assert row["kind"] == "no_nvtx" and row["text"].startswith("the trace has no NVTX range")
    assert "vLLM's engine loop" in row["text"]


def test_engine_not_traced_names_the_processes_that_were(tmp_path):
    """An export whose engine recorded no kernel (its kernel rows deleted): one line, exit 2,
    naming the processes that made CUDA calls and how many (SQL), for every command."""
    path = _copy(_serve("sigint"), tmp_path)
    _sql(path, "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con = ro(path)
    (pid, calls), = con.execute("""SELECT globalTid / 16777216 % 16777216, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME
                                   GROUP BY 1""").fetchall()
    for cmd in (["analyze", path, "--no-cache"], ["tp", path], ["report", path, "-o", tmp_path / "x.md"]):
        r = run(*cmd)
        assert r.exit_code == 2, r.output
        line = r.output.strip()
        assert len(line.splitlines()) == 1
        assert "no kernels recorded — was `--trace=cuda` on?" in line
        assert "the engine process was not traced" in line.lower()
        assert f"pid {pid} (python3, {calls:,} CUDA calls)" in line


def test_a_capture_that_ends_before_the_traffic_has_no_engine_step(tmp_path):
    """The flush capture with every CUDA record after the start-up's last warm-up deleted (the
    traffic not recorded; the session as it was): its two iterations after the graph capture are
    vLLM's warm-up runs, not steps. No step, one line naming the start-up it holds, with the
    graph captures SQL counts."""
    path = _copy(_serve("flush"), tmp_path)
    con = ro(path)
    d = json.loads([x for x in (SERVE / "llama-3.1-8b_serve_flush.log").read_text(encoding="utf-8").splitlines()
                    if x.startswith("capture_serve: {")][0][len("capture_serve: "):])
    traffic = int((d["t0_unix"] + d["marks"]["traffic_start"]) * 1e9) - con.execute(
        "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    con.close()
    _sql(path, *[f"DELETE FROM {t} WHERE start > {traffic}" for t in TABLES + ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE",)])
    con = ro(path)
    captures = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                              WHERE s.value LIKE 'cudaStreamEndCapture%'""").fetchone()[0]
    after = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                           WHERE s.value = '_prepare_pos_seq_lens_kernel' AND k.start > (
                             SELECT max(r.end) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                             WHERE s.value LIKE 'cudaStreamEndCapture%')""").fetchone()[0]
    assert captures > 0 and after == 2  # the warm-up runs after the capture
    end, session = _records_end(con, _engine_pid(con)), _session(con)
    r = run("analyze", path, "--no-cache")
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "no engine step found" in line
    assert f"CUDA-graph capture: {captures:,} graphs" in line and "start-up only" in line
    assert f"its CUDA records end {(session - end) / 1e9:.1f} s before the session" in line


DEEPSEEK = FIXTURES / "models" / "deepseek-v2-lite_r32_graph_plain.sqlite.gz"
_EARLY_SQL = ("SELECT count(*), max(r.start - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
              "ON r.correlationId = k.correlationId AND r.globalTid / 16777216 % 16777216 = k.globalPid / 16777216 % 16777216 "
              "WHERE r.start - k.start > 1000000")


@pytest.mark.parametrize("shift_ns, words", [(-10_000_000_000, "start before the call that launched them"),
                                             (1_000_000_000_000, "start 600.0 s or more after the call that launched them")])
def test_gpu_records_on_another_clock_are_refused(tmp_path, shift_ns, words):
    """The GPU's rows moved 10 s earlier (kernels before their launches) or 1000 s later (ten
    minutes and more after them): the steps would be measured across two clocks, so nothing is
    analyzed: one line, exit 2, the source untouched. Counted in SQL: every kernel moves."""
    p = _copy(gunzipped(need(DEEPSEEK)), tmp_path)
    _sql(p, *(f"UPDATE {t} SET start = start + {shift_ns}, end = end + {shift_ns}" for t in
              ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")))
    before = sha256(p)
    if shift_ns < 0:
        n, by = ro(p).execute(_EARLY_SQL).fetchone()
        assert n == ro(p).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    r = run("analyze", p, "--json", "--no-cache")
    assert r.exit_code == 2 and r.stdout == ""
    err = r.stderr.strip()
    assert "\n" not in err and "the GPU's records are not on the host's clock" in err and words in err
    if shift_ns < 0:
        assert f"{n:,} of its {n:,} kernels start before the call that launched them, by up to {by / 1e9:.1f} s" in err
    assert "nsys export --type sqlite" in err
    assert sha256(p) == before


def test_a_few_kernels_off_the_clock_are_named_and_the_rest_analyzed(tmp_path):
    """Ten kernels moved 5 s before their launches (under 1 % of 89,894): the defect comes first in
    the JSON's `capture`, with the count SQL gives, and the steps are still analyzed."""
    p = _copy(gunzipped(need(DEEPSEEK)), tmp_path)
    _sql(p, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start - 5000000000, end = end - 5000000000 "
            "WHERE rowid IN (SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC LIMIT 10)")
    n, _ = ro(p).execute(_EARLY_SQL).fetchone()
    assert n == 10
    r = run("analyze", p, "--json", "--no-cache")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    clock = [d for d in doc["capture"] if d["kind"] == "clock"]
    assert len(clock) == 1 and clock[0]["text"].startswith(
        f"the GPU's records are not on the host's clock: {n:,} of its 89,894 kernels start before")
    assert doc["capture"][0]["kind"] == "clock" and len(doc["steps"]) > 0
