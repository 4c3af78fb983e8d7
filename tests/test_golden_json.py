"""Golden JSON: `stepscope analyze FILE --json --steps all` on every committed export (every
`.sqlite` and `.sqlite.gz` under fixtures/) and every foreign export present equals the stored
document in tests/golden/<name>.json — no figure changes when the data path changes.

Compared after `tests/golden/regen.py`'s `canonical`: `trace.path` (machine-specific) dropped
and the order among tied entries of ranked lists normalized; every number, float included, must
be exactly as stored. A document over 64 KiB (a whole-run capture's thousands of steps) is
compared in regen.py's `stored` form: its long lists by length, first entries and a SHA-256 of
each sixteenth of their JSON text, so every byte still counts.  When a figure is meant to change, regenerate with
`python tests/golden/regen.py [NAME ...]` and say why in the commit.
"""

from __future__ import annotations

import json

import pytest

from tests.golden.regen import EXTERNAL, GOLDEN, analyze, canonical, golden_path, name, stored, traces

TRACES = traces()
MAX_GOLDEN_BYTES = 3 * 2**20


def _diff(want, got, path="$", out=None, limit=20):
    """Paths where two JSON values differ (at most `limit`)."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if type(want) is not type(got):
        out.append(f"{path}: {want!r:.120} != {got!r:.120}")
    elif isinstance(want, dict):
        for k in list(want) + [k for k in got if k not in want]:
            if k not in got:
                out.append(f"{path}.{k}: missing")
            elif k not in want:
                out.append(f"{path}.{k}: unexpected")
            else:
                _diff(want[k], got[k], f"{path}.{k}", out, limit)
    elif isinstance(want, list):
        if len(want) != len(got):
            out.append(f"{path}: {len(want)} entries != {len(got)}")
        for i, (a, b) in enumerate(zip(want, got)):
            _diff(a, b, f"{path}[{i}]", out, limit)
    elif want != got:
        out.append(f"{path}: {want!r:.120} != {got!r:.120}")
    return out[:limit]


@pytest.mark.parametrize("trace", TRACES, ids=[name(t) for t in TRACES])
def test_analyze_json_matches_golden(trace):
    gold = golden_path(trace)
    assert gold.exists(), f"no golden for {trace.name}: run python tests/golden/regen.py {name(trace)}"
    want = json.loads(gold.read_text(encoding="utf-8"))
    got = stored(canonical(analyze(trace)))
    if got != want:
        lines = _diff(want, got)
        pytest.fail(f"{trace.name}: analyze --json differs from {gold.name} (stored != now):\n  "
                    + "\n  ".join(lines))


def test_canonical_keeps_order_between_different_figures():
    k1 = {"name": "b", "time_ns": 5, "count": 1, "demangled": "z"}
    k2 = {"name": "b", "time_ns": 5, "count": 2, "demangled": "a"}
    k3 = {"name": "a", "time_ns": 3, "count": 1, "demangled": "q"}

    def doc(*kernels):
        return {"trace": {"path": "/x", "nsys_version": "1"}, "steps": [{"kernels": list(kernels)}]}

    c = canonical(doc(k1, k2, k3))
    assert c["trace"] == {"nsys_version": "1"}
    # k1, k2 tie (time 5, name b): their order is normalized; the ranking 5 before 3 is kept
    assert canonical(doc(k2, k1, k3)) == c
    assert canonical(doc(k3, k1, k2)) != c
    assert canonical(doc(k1, k2, dict(k3, time_ns=4))) != c


def test_stored_form_digests_every_entry_of_a_long_list():
    steps = [{"step": i, "time_ns": 100 + i} for i in range(200)]
    doc = {"trace": {}, "steps": steps, "pad": "x" * (70 * 1024)}
    s = stored(doc)
    assert s["steps"]["digest_of_list"]["len"] == 200 and s["steps"]["digest_of_list"]["head"] == steps[:2]
    assert stored({"steps": steps[:10]}) == {"steps": steps[:10]}  # a small document is kept whole
    for i in (0, 77, 199):  # one figure changed anywhere changes one slice's digest
        other = [dict(x) for x in steps]
        other[i]["time_ns"] += 1
        a, b = s["steps"]["digest_of_list"]["slices"], stored(dict(doc, steps=other))["steps"]["digest_of_list"]["slices"]
        assert sum(x != y for x, y in zip(a, b)) == 1


def test_golden_files_small_and_not_stale():
    files = sorted(GOLDEN.glob("*.json"))
    assert sum(p.stat().st_size for p in files) <= MAX_GOLDEN_BYTES
    if not EXTERNAL.is_dir():
        pytest.skip(f"{EXTERNAL} not present: cannot tell stale golden files")
    stale = {p.stem for p in files} - {name(t) for t in TRACES}
    assert not stale, f"golden files without a trace: {sorted(stale)}"


def test_the_sections_of_some_steps_are_their_rows_of_every_steps():
    """sections_text(d, ids) is sections_text(d)'s rows of those steps, with the run's columns
    (the 54 two-rank steps of the foreign H100 capture, their TP sections too, in pieces of 5:
    a piece's edge falls inside a group of ranks' steps)."""
    import polars as pl

    import stepscope
    from stepscope.render.sections import sections_text
    from tests.conftest import EXTERNAL, need

    r = stepscope.analyze(need(EXTERNAL / "nsysai_h100_2gpu_1s.sqlite"), cache=False)
    d = r.diagnosis
    every = sections_text(d)
    assert "tp" in every.columns and every.height == len(r.steps) == 54
    ids = list(r.steps)
    pieces = [sections_text(d, ids[i:i + 5]) for i in range(0, len(ids), 5)]
    assert pl.concat(pieces).equals(every)
    assert all(p.columns == every.columns for p in pieces)
