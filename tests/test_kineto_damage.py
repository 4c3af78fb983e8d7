"""PyTorch-profiler JSON of the wrong shape: NaN, Infinity, text or huge numbers as ts/dur,
ids beyond their columns, args that are not an object, deep nesting. Each is exit 2 with one
line or a counted warning; never a traceback."""

from __future__ import annotations

import gzip
import json

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.ingest.kineto import read_kineto
from tests.conftest import FIXTURES, need, sha256

TORCH = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"


def _doc() -> dict:
    return json.loads(gzip.decompress(need(TORCH).read_bytes()))


def _kernels(doc):
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def write(tmp_path, doc, name="t.json", text=None):
    p = tmp_path / name
    p.write_text(text if text is not None else json.dumps(doc))
    return p


def run(*args):
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


@pytest.fixture(scope="module")
def base_kernels(tmp_path_factory):
    return read_kineto(write(tmp_path_factory.mktemp("k"), _doc())).kernels.height


@pytest.mark.parametrize("field,value", [
    ("ts", "NaN"), ("dur", "Infinity"), ("dur", "-Infinity"), ("ts", '"soon"'), ("ts", "1e400"),
    ("dur", "1" + "0" * 30), ("ts", '"' + "9" * 5000 + '"'), ("ts", "true"), ("dur", "[1]"), ("ts", "null"),
])
def test_unusable_times_are_left_out_and_counted(tmp_path, base_kernels, field, value):
    doc = _doc()
    for e in _kernels(doc)[:3]:
        e[field] = "@@"
    text = json.dumps(doc).replace('"@@"', value)
    p = write(tmp_path, None, text=text)
    before = sha256(p)
    t = read_kineto(p)
    assert t.kernels.height == base_kernels - 3
    assert "3 trace events were left out (3 whose ts or dur is not a finite number of µs)" in t.warnings
    r = run("analyze", p, "--json")
    assert r.exit_code == 0 and "3 whose ts or dur" in r.stdout
    assert sha256(p) == before


def test_a_negative_duration_is_reported(tmp_path, base_kernels):
    doc = _doc()
    _kernels(doc)[5]["dur"] = -3.5
    t = read_kineto(write(tmp_path, doc))
    assert t.kernels.height == base_kernels - 1
    assert f"1 of {base_kernels:,} kernels left out (1 ending before they start)" in t.warnings


def test_ids_beyond_their_columns(tmp_path, base_kernels):
    doc = _doc()
    api = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"]
    api[0]["pid"] = 1 << 40
    api[1]["tid"] = "-99999999999"
    ks = _kernels(doc)
    ks[0]["args"]["stream"] = 1 << 33         # falls back to the event's tid
    ks[1]["args"]["correlation"] = 1 << 70   # no launching call then
    ks[2]["args"]["grid"] = [1 << 64, "x", None]
    t = read_kineto(write(tmp_path, doc))
    assert "2 trace events were left out (2 whose pid or tid is not a 32-bit integer)" in t.warnings
    assert t.kernels.height == base_kernels
    assert run("analyze", tmp_path / "t.json").exit_code == 0


def test_args_that_are_not_an_object(tmp_path, base_kernels):
    doc = _doc()
    ks = _kernels(doc)
    ks[0]["args"] = ["device", 0]
    ks[1]["args"] = "stream 7"
    next(e for e in doc["traceEvents"] if e.get("ph") == "M")["args"] = 42
    t = read_kineto(write(tmp_path, doc))
    assert "2 trace events have args that are not an object: read without them" in t.warnings
    assert t.kernels.height == base_kernels


def test_odd_fields_are_ignored(tmp_path, base_kernels):
    doc = _doc()
    doc["traceEvents"][:0] = [{"ph": "X", "cat": ["kernel"], "ts": 1, "dur": 1}, {"ph": {"x": 1}, "cat": "kernel"},
                              {"ph": "X", "cat": "kernel", "name": {"n": 1}, "ts": 1e300, "dur": 1}, 7, None]
    doc["deviceProperties"] = [{"id": "zero", "name": 5}, {"id": 0, "name": ["H200"]}, "gpu"]
    doc["schemaVersion"] = {"v": [1] * 1000}
    t = read_kineto(write(tmp_path, doc))
    assert t.kernels.height == base_kernels
    assert t.gpus.height == 1 and t.gpus["name"][0] is None
    assert len(t.schema_version) < 60


@pytest.mark.parametrize("text,needle", [
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ('{"traceEvents": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": NaN, "dur": 1}]}', "none of its 1 kernel events"),
    ('{"traceEvents": {"ph": "X"}}', "no traceEvents list"),
])
def test_unusable_documents_are_one_line(tmp_path, text, needle):
    p = write(tmp_path, None, text=text)
    r = run("analyze", p)
    assert r.exit_code == 2 and needle in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_every_command_reads_a_damaged_trace(tmp_path):
    doc = _doc()
    ks = _kernels(doc)
    ks[0]["ts"], ks[1]["args"], ks[2]["dur"] = "NaN", [], -1
    p = write(tmp_path, doc)
    before = sha256(p)
    for args in (["analyze", p], ["compare", p, p, "--json"], ["tp", p], ["report", p, "-o", tmp_path / "r.html"],
                 ["export", p, "-o", tmp_path / "e.json"]):
        r = run(*args)
        assert r.exit_code == 0, (args, r.output)
    assert sha256(p) == before


def test_names_with_lone_surrogates(tmp_path, base_kernels):
    r"""JSON's \ud800 escapes make Python strings that are not UTF-8: polars refused the
    name column (UnicodeEncodeError, exit 3)."""
    doc = _doc()
    _kernels(doc)[0]["name"] = "\udc00bad"
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation":
            e["name"] += "\ud800"
    p = write(tmp_path, doc)
    t = read_kineto(p)
    assert t.kernels.height == base_kernels
    assert "7 event names are not valid Unicode (lone surrogates): read with U+FFFD" in t.warnings
    assert "\ufffdbad" in t.strings["value"].to_list()
    for args in (["analyze", p, "--json"], ["analyze", p], ["export", p, "-o", tmp_path / "e.json"]):
        assert run(*args).exit_code == 0
