"""The one-shot analysis kept beside a cached export's frames (library.load, ingest/cache.py's
derived entries): a hit gives the document the plain analysis gives, byte for byte, and any
change of what the analysis depends on (the rules file, --step-regex, --strict, the code, the
export) or a damaged file is a miss that analyzes again."""

from __future__ import annotations

import shutil

import pytest

from stepscope.ingest import cache
from tests.conftest import FIXTURES, CliRunner, need

TRACES = ["llama8b_decode_b1_eager.sqlite", "llama8b_decode_b1_graph.sqlite", "llama8b_decode_b1_eager_tp2.sqlite",
          "llama8b_prefill_b1_eager.sqlite", "round5/llama8b_decode_b1_bare.sqlite",
          "round5/llama1b_decode_emit_nvtx.sqlite", "round5/llama1b_decode_3steps_nonvtx.sqlite"]


@pytest.fixture
def small_cached(monkeypatch):
    monkeypatch.setattr(cache, "MIN_KERNELS", 100)  # the fixtures have hundreds of kernels, not 50,000


def _copy(tmp_path, name: str):
    p = tmp_path / name.replace("/", "_")
    shutil.copy(need(FIXTURES / name), p)
    return p


def _analyze(p, *opts: str):
    from stepscope.cli import app

    r = CliRunner().invoke(app, ["analyze", str(p), "--json", "--steps", "all", *opts])
    return r.exit_code, r.stdout


def _entries(tmp_path):
    return sorted((tmp_path / ".stepscope-cache").glob("*/analysis-*"))


class _NoAnalysis(Exception):
    pass


def _forbid_analysis(monkeypatch):
    """The next analyze must come from the kept analysis: analyzing the activities raises."""
    from stepscope.analysis import inventory

    def refuse(*a, **k):
        raise _NoAnalysis
    monkeypatch.setattr(inventory, "analyze_trace", refuse)


def _counted(monkeypatch, module, name: str) -> list:
    """module.name, counting its calls (one entry per call in the returned list)."""
    calls, real = [], getattr(module, name)

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(module, name, counted)
    return calls


def _count_analyses(monkeypatch) -> list:
    from stepscope.analysis import inventory

    return _counted(monkeypatch, inventory, "analyze_trace")


@pytest.mark.parametrize("name", TRACES)
def test_a_kept_analysis_gives_the_plain_document(tmp_path, monkeypatch, small_cached, name):
    p = _copy(tmp_path, name)
    code, plain = _analyze(p, "--no-cache")
    assert code == 0 and not (tmp_path / ".stepscope-cache").exists()
    assert _analyze(p) == (0, plain)  # reads SQLite, writes the frames and the analysis
    assert len(_entries(tmp_path)) == 1
    assert (_entries(tmp_path)[0] / "acts.parquet").exists()
    with monkeypatch.context() as m:
        _forbid_analysis(m)
        assert _analyze(p) == (0, plain)  # from the kept analysis: no activity analyzed


@pytest.mark.parametrize("name", TRACES[:3])
def test_the_hit_reads_no_event_frames(tmp_path, monkeypatch, small_cached, name):
    """On a hit the kernel, memop and API frames of the entry are not even read, nor the kept
    activities and launch calls (a graph trace's replay figures are kept with the diagnosis)."""
    p = _copy(tmp_path, name)
    _analyze(p)
    opened = []
    real_read = cache.Path.read_bytes

    def spy_bytes(self):
        opened.append(self)
        return real_read(self)
    monkeypatch.setattr(cache.Path, "read_bytes", spy_bytes)
    _forbid_analysis(monkeypatch)
    assert _analyze(p)[0] == 0
    (kept,) = _entries(tmp_path)
    frames = {f.name for f in opened if f.parent == kept.parent}
    assert frames == {"nvtx.parquet", "strings.parquet", "gpus.parquet", "processes.parquet", "threads.parquet"}
    mine = {f.name for f in opened if f.parent == kept}
    # the one-shot document reads the per-step tables only: the per-event frames stay on disk
    assert {"kernels.parquet", "steps.parquet", "classes.parquet"} <= mine
    assert not {"acts.parquet", "launch_calls.parquet"} & mine


def test_restored_activities_are_read_as_the_caller_says(tmp_path, small_cached):
    """A kept analysis' activities and launch calls come back, equal, read up front by default;
    with events=False they are not read (an access says so, in one line) until the caller
    asks (Inventory.read_events); and never when the per-event frames are let go first."""
    from stepscope import library
    from stepscope.analysis.memory import ONE_SHOT

    p = _copy(tmp_path, TRACES[2])  # TP=2: two processes, two devices
    first, key = library._load(p, None, None, True, False, ONE_SHOT)
    assert key is not None
    again, key2 = library._load(p, None, None, True, False, ONE_SHOT)
    assert key2 == key and "acts" in again.__dict__ and "_unread" not in again.__dict__
    assert again.acts.equals(first.acts) and again.launch_calls.equals(first.launch_calls)
    assert again.api.equals(first.api) and again.steps.equals(first.steps)
    assert again.warnings == first.warnings
    lean, _ = library._load(p, None, None, True, False, ONE_SHOT, events=False)
    assert "acts" not in lean.__dict__ and lean.steps.equals(first.steps)
    with pytest.raises(AttributeError, match="not read from the kept analysis"):
        lean.acts  # noqa: B018
    assert lean.read_events().acts.equals(first.acts) and lean.launch_calls.equals(first.launch_calls)
    third, _ = library._load(p, None, None, True, False, ONE_SHOT, events=False)
    third.drop_event_frames()
    assert third.acts.height == 0 and third.acts.schema == first.acts.schema
    assert third.launch_calls.schema == first.launch_calls.schema


def test_a_kept_analysis_removed_while_in_use_is_one_line(tmp_path, small_cached):
    from stepscope import library
    from stepscope.analysis.memory import ONE_SHOT
    from stepscope.errors import InputError

    p = _copy(tmp_path, TRACES[0])
    library._load(p, None, None, True, False, ONE_SHOT)
    inv, _ = library._load(p, None, None, True, False, ONE_SHOT, events=False)
    shutil.rmtree(_entries(tmp_path)[0])
    with pytest.raises(InputError, match="changed while it was in use"):
        inv.read_events()


def test_events_unread_are_read_again_when_asked_for(tmp_path, small_cached):
    from stepscope.ingest import read_trace

    p = _copy(tmp_path, TRACES[0])
    full = read_trace(p, launch_config=False, cache=True)
    lazy = read_trace(p, launch_config=False, cache=True, events=False)
    assert lazy.cache_dir == full.cache_entry and "kernels" not in lazy.__dict__
    with pytest.raises(AttributeError, match="read_events"):
        lazy.kernels  # noqa: B018 (no read on an access)
    assert lazy.read_events() is lazy
    for f in ("kernels", "memops", "api", "nvtx", "strings"):
        assert getattr(lazy, f).equals(getattr(full, f)), f
    plain = read_trace(p, launch_config=False, cache=False)
    assert lazy.kernels.height == plain.kernels.height == 420


def test_rules_file_edited_in_place_is_another_analysis(tmp_path, monkeypatch, small_cached):
    """The key holds the rules file's bytes, not only its path."""
    p = _copy(tmp_path, TRACES[0])
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nclass = "other"\nfield = "any"\npattern = "(?i)gemm|cutlass|sm90"\n')
    code, plain_a = _analyze(p, "--no-cache", "--rules", str(rules))
    assert code == 0
    assert _analyze(p, "--rules", str(rules)) == (0, plain_a)
    calls = _count_analyses(monkeypatch)
    assert _analyze(p, "--rules", str(rules)) == (0, plain_a) and not calls  # a hit
    rules.write_text('[[rule]]\nclass = "norm"\nfield = "any"\npattern = "(?i)gemm|cutlass|sm90"\n')
    monkeypatch.undo()
    monkeypatch.setattr(cache, "MIN_KERNELS", 100)
    code, plain_b = _analyze(p, "--no-cache", "--rules", str(rules))
    assert plain_b != plain_a
    calls = _count_analyses(monkeypatch)
    assert _analyze(p, "--rules", str(rules)) == (0, plain_b) and calls == [1]  # a miss
    # and without --rules: the default rules' analysis, not the user's
    _, plain = _analyze(p, "--no-cache")
    assert _analyze(p) == (0, plain) and plain not in (plain_a, plain_b)


def test_step_regex_and_strict_are_part_of_the_key(tmp_path, monkeypatch, small_cached):
    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p, "--no-cache")
    assert _analyze(p) == (0, plain)
    # a pattern that matches no range: the steps come from elsewhere, with a warning ...
    code, plain_rx = _analyze(p, "--no-cache", "--step-regex", "^no such range$")
    assert code == 0 and "matched no NVTX range" in plain_rx and plain_rx != plain
    assert _analyze(p, "--step-regex", "^no such range$") == (0, plain_rx)
    calls = _count_analyses(monkeypatch)
    assert _analyze(p, "--step-regex", "^no such range$") == (0, plain_rx) and not calls
    # ... which --strict turns into a failure, kept analysis or not
    strict_plain = _analyze(p, "--no-cache", "--strict", "--step-regex", "^no such range$")
    assert strict_plain[0] != 0
    assert _analyze(p, "--strict", "--step-regex", "^no such range$")[0] == strict_plain[0]
    assert _analyze(p) == (0, plain)


def test_another_analysis_format_is_another_analysis(tmp_path, monkeypatch, small_cached):
    """A change to what the analysis holds bumps ANALYSIS_FORMAT: the kept one is not read again
    but replaced."""
    from stepscope import library

    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p)
    first = _entries(tmp_path)
    monkeypatch.setattr(library, "ANALYSIS_FORMAT", library.ANALYSIS_FORMAT + 1)
    calls = _count_analyses(monkeypatch)
    assert _analyze(p) == (0, plain) and calls == [1]
    after = _entries(tmp_path)
    assert len(after) == 1 and after != first  # the old one replaced, not kept beside


@pytest.mark.parametrize("name, version", [("diagnosis", "DIAGNOSIS_FORMAT"), ("texts", "TEXTS_FORMAT")])
def test_a_format_version_renews_its_own_entry_only(tmp_path, monkeypatch, small_cached, name, version):
    """The diagnosis and the texts are keyed by their own format version beside the analysis':
    bumping one renews that entry, the kept analysis still read (no analysis of the activities)."""
    from stepscope import library

    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p)
    entry = tmp_path / ".stepscope-cache"
    before = sorted(entry.glob(f"*/{name}-*"))
    others = sorted(x for x in entry.glob("*/*-*") if not x.name.startswith(name + "-"))
    assert len(before) == 1
    monkeypatch.setattr(library, version, getattr(library, version) + 1)
    _forbid_analysis(monkeypatch)
    assert _analyze(p) == (0, plain)
    after = sorted(entry.glob(f"*/{name}-*"))
    assert len(after) == 1 and after != before
    assert sorted(x for x in entry.glob("*/*-*") if not x.name.startswith(name + "-")) == others


def test_the_bundled_rules_are_in_the_key():
    from stepscope import library

    library._bundled_rules_digest.cache_clear()
    d = library._bundled_rules_digest()
    assert len(d) == 64 and d == library._bundled_rules_digest()
    assert not hasattr(library, "_code_digest")  # no hash of the package's source


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta"])
def test_a_damaged_kept_analysis_is_a_miss(tmp_path, monkeypatch, small_cached, damage):
    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p)
    (entry,) = _entries(tmp_path)
    f = entry / ("meta.json" if damage == "meta" else "steps.parquet")
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 3]
    else:
        data = bytearray(b'{"derived_format": 1, "key": "x"}')
    f.write_bytes(bytes(data))
    calls = _count_analyses(monkeypatch)
    assert _analyze(p) == (0, plain) and calls == [1]
    # written anew, and used
    assert len(_entries(tmp_path)) == 1
    assert _analyze(p) == (0, plain) and calls == [1]


def test_an_untrusted_kept_analysis_is_not_read(tmp_path, monkeypatch, small_cached):
    import os

    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p)
    (entry,) = _entries(tmp_path)
    os.chmod(entry, 0o777)  # writable by others: anyone could have planted it
    calls = _count_analyses(monkeypatch)
    assert _analyze(p) == (0, plain) and calls == [1]


def test_a_changed_export_is_another_analysis(tmp_path, monkeypatch, small_cached):
    import sqlite3

    p = _copy(tmp_path, TRACES[0])
    _analyze(p)
    con = sqlite3.connect(p)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid IN "
                "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC LIMIT 10)")
    con.commit()
    con.close()
    _, plain = _analyze(p, "--no-cache")
    calls = _count_analyses(monkeypatch)
    assert _analyze(p) == (0, plain) and calls == [1]


def test_only_the_one_shot_analysis_is_kept(tmp_path, small_cached):
    """The notebook's and other commands' inventories keep other columns: never stored, never read."""
    from stepscope import library

    p = _copy(tmp_path, TRACES[0])
    inv = library.load(p)  # NOTEBOOK
    assert inv.trace.cache_dir is not None and not _entries(tmp_path)
    _analyze(p)
    assert len(_entries(tmp_path)) == 1
    again = library.load(p)
    assert set(again.acts.columns) == set(inv.acts.columns) and again.acts.equals(inv.acts)


def test_prune_counts_the_kept_analysis(tmp_path, small_cached):
    p = _copy(tmp_path, TRACES[0])
    _analyze(p)
    (entry,) = _entries(tmp_path)
    own = sum(f.stat().st_size for f in entry.iterdir())
    assert cache._size(entry.parent) > own > 0


def test_a_kept_diagnosis_holds_the_calibration_free_frames(tmp_path, monkeypatch, small_cached):
    """The gaps, launch, floors, TP and prologue figures are kept too; on a hit none is computed."""
    from stepscope.analysis import diagnosis

    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p, "--no-cache")
    _analyze(p)
    assert len(sorted((tmp_path / ".stepscope-cache").glob("*/diagnosis-*"))) == 1

    def refuse(*a, **k):
        raise _NoAnalysis
    monkeypatch.setattr(diagnosis, "calibration_free", refuse)
    _forbid_analysis(monkeypatch)
    assert _analyze(p) == (0, plain)


def test_the_calibration_is_applied_to_a_kept_analysis(tmp_path, small_cached):
    """The what-if's calibration is not in the key: its figures are computed on every run."""
    p = _copy(tmp_path, "round5/llama8b_decode_b1_eager.sqlite")
    cal = tmp_path / "cal.json"
    from stepscope.cli import app

    r = CliRunner().invoke(app, ["calibrate", str(need(FIXTURES / "round5/llama8b_decode_b1_graph.sqlite")),
                                 str(need(FIXTURES / "round5/llama8b_decode_b1_eager.sqlite")), "-o", str(cal)])
    assert r.exit_code == 0, r.output
    _, plain = _analyze(p, "--no-cache")
    _, plain_cal = _analyze(p, "--no-cache", "--calibration", str(cal))
    assert plain_cal != plain
    assert _analyze(p) == (0, plain)
    assert _analyze(p, "--calibration", str(cal)) == (0, plain_cal)  # a hit, with the other constants
    assert _analyze(p) == (0, plain)


def test_compare_and_the_terminal_view_from_a_kept_analysis(tmp_path, monkeypatch, small_cached):
    from stepscope.cli import app

    a, b = _copy(tmp_path, TRACES[0]), _copy(tmp_path, TRACES[1])

    def both():
        runner = CliRunner()
        cmp = runner.invoke(app, ["compare", str(a), str(b), "--json", *opts])
        term = runner.invoke(app, ["analyze", str(a), "--steps", "all", *opts])
        assert cmp.exit_code == 0 and term.exit_code == 0, (cmp.output, term.output)
        return cmp.stdout, term.stdout
    opts = ["--no-cache"]
    plain = both()
    opts = []
    assert both() == plain  # writes
    assert len(_entries(tmp_path)) == 2
    _forbid_analysis(monkeypatch)
    assert both() == plain  # both from their kept analyses


def test_damaged_activities_are_found_when_read(tmp_path, small_cached):
    """The activities of a kept analysis are checked when read: a flipped byte is one line
    (and the entry goes), never other activities."""
    from stepscope import library
    from stepscope.analysis.memory import ONE_SHOT
    from stepscope.errors import InputError

    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p)
    (entry,) = _entries(tmp_path)
    f = entry / "acts.parquet"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(InputError, match="changed while it was in use"):
        library._load(p, None, None, True, False, ONE_SHOT)  # read up front
    assert not _entries(tmp_path)
    assert _analyze(p) == (0, plain)  # analyzed again, and kept again
    assert len(_entries(tmp_path)) == 1


_NUMPY_PROBE = """
import sys
from stepscope.ingest import cache
cache.MIN_KERNELS = 100  # the fixture has hundreds of kernels, not 50,000
from stepscope.cli import run
code = run(["analyze", sys.argv[1], "--json", "--steps", "all"])
sys.stdout.flush()
print(f"code={code} numpy={'numpy' in sys.modules}", file=sys.stderr)
"""


def test_a_kept_analysis_is_read_without_importing_numpy(tmp_path):
    """A hit computes no array, and `import numpy` was a fifth of a warm run (0.15 s of 0.7 s,
    1M kernels): the analyses import it on first use (analysis/lazy_numpy.py). The run that
    analyzes does import it, so the probe can tell."""
    import subprocess
    import sys

    p = _copy(tmp_path, "llama8b_decode_b1_eager.sqlite")
    outs = []
    for _ in range(2):
        cp = subprocess.run([sys.executable, "-c", _NUMPY_PROBE, str(p)], capture_output=True, text=True,
                            timeout=120)
        outs.append((cp.stderr.strip().splitlines()[-1], cp.stdout))
    assert outs[0][0] == "code=0 numpy=True", outs[0][0]  # the first run analyzes the activities
    assert len(_entries(tmp_path)) == 1
    assert outs[1][0] == "code=0 numpy=False", outs[1][0]  # the second reads the kept analysis
    assert outs[1][1] == outs[0][1] and '"trace"' in outs[0][1]


def _count_texts(monkeypatch) -> list:
    from stepscope.render import json as render_json

    return _counted(monkeypatch, render_json, "inventory_texts")


@pytest.mark.parametrize("name", [TRACES[0], TRACES[2], "round5/llama8b_decode_b1_bare.sqlite"])
def test_the_steps_texts_are_kept_with_the_analysis(tmp_path, monkeypatch, small_cached, name):
    """The inventory's part of each step's text (render.json.inventory_texts) is kept beside the
    analysis and read back: a hit builds none and writes the plain document (a selection of
    steps is narrowed first, and builds its own few)."""
    p = _copy(tmp_path, name)
    code, plain = _analyze(p, "--no-cache")
    calls = _count_texts(monkeypatch)
    assert _analyze(p) == (0, plain) and len(calls) == 1  # built once, for the document and the entry
    (texts,) = (tmp_path / ".stepscope-cache").glob("*/texts-*")
    from stepscope import library

    analysis_key = _entries(tmp_path)[0].name.split("-", 1)[1]  # the analysis' key, with TEXTS_FORMAT
    assert texts.name.split("-", 1)[1] == library._entry_key(analysis_key, "texts", library.TEXTS_FORMAT)
    assert _analyze(p) == (0, plain) and len(calls) == 1  # read back, none built
    _, one = _analyze(p, "--no-cache", "--steps", "0")
    assert _analyze(p, "--steps", "0") == (0, one)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_kept_texts_are_built_again(tmp_path, monkeypatch, small_cached, damage):
    p = _copy(tmp_path, TRACES[0])
    _, plain = _analyze(p)
    (f,) = (tmp_path / ".stepscope-cache").glob("*/texts-*/texts.parquet")
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        data = data[: len(data) // 3]
    f.write_bytes(bytes(data))
    calls = _count_texts(monkeypatch)
    assert _analyze(p) == (0, plain) and len(calls) == 1
    assert _analyze(p) == (0, plain) and len(calls) == 1  # written anew, and used


def test_a_narrowed_inventory_is_not_the_kept_analysis(tmp_path, small_cached):
    """Diagnosis.only_steps narrows the inventory to a few steps: it no longer stands for the kept
    analysis, so nothing made from it (the steps' texts) is kept under that key; the whole
    inventory's texts stay those of every step."""
    from stepscope import library
    from stepscope.analysis.memory import ONE_SHOT

    p = _copy(tmp_path, TRACES[2])  # TP=2: two steps
    d = library.diagnosis(p, memory=ONE_SHOT)
    assert d.inv.kept is not None and d.inv.steps.height == 2
    narrowed = d.only_steps("0")
    assert narrowed.inv.kept is None and library.step_texts(narrowed.inv) is None
    assert library.step_texts(d.inv)["step"].to_list() == d.inv.step_ids()
