#!/usr/bin/env python3
"""Regenerate the golden `stepscope analyze --json --steps all` documents in tests/golden/.

    python tests/golden/regen.py            # every committed fixture + ../shared/external/*.sqlite
    python tests/golden/regen.py NAME ...   # only these (file stems)
    python tests/golden/regen.py --code DIR # run the stepscope of another checkout (e.g. a clean
                                            # `git archive HEAD` export) on this repo's traces

Run it only when a figure is *meant* to change, and say why in the commit: these files are what
tests/test_golden_json.py holds the analyzer to ("no figure changes when the data path changes").

Stored form (`canonical`, then `stored`): the JSON document minus the machine-specific
`trace.path`, with the order of tied entries normalized (see `canonical`), written compact (no
indentation), one file per trace: tests/golden/<name>.json (`name`: the stem, prefixed by the
fixture's folder under fixtures/); a document over 64 KiB keeps its long lists as digests
(`stored`).  Floats are stored as Python writes them (repr, exact
round trip) and compared exactly.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
ROOT = GOLDEN.parent.parent
FIXTURES = ROOT / "fixtures"
EXTERNAL = Path(os.environ.get("STEPSCOPE_EXTERNAL") or ROOT.parent / "shared" / "external")  # as tests/conftest.py


def traces() -> list[Path]:
    """Every committed fixture export (`fixtures/**/*.sqlite` and `*.sqlite.gz`, the bundled
    steps, the vLLM and torch pairs, the serving runs, the model and `vllm serve` captures) and
    every foreign export present."""
    mine = [p for ext in ("*.sqlite", "*.sqlite.gz") for p in FIXTURES.rglob(ext)
            if ".stepscope-cache" not in p.parts]
    return sorted(mine) + sorted(EXTERNAL.glob("*.sqlite"))


def name(trace: Path) -> str:
    """The golden file's stem: a foreign export's or a top-level fixture's own stem, else the
    fixture's path under fixtures/ with `__` for `/` (fixtures/vllm/ and fixtures/round5/ hold
    exports of one name)."""
    trace = Path(trace)
    stem = trace.name[: -len(".gz")] if trace.name.endswith(".gz") else trace.name
    stem = stem[: -len(".sqlite")] if stem.endswith(".sqlite") else Path(stem).stem
    try:
        rel = trace.resolve().parent.relative_to(FIXTURES.resolve())
    except ValueError:
        return stem
    return "__".join((*rel.parts, stem))


def golden_path(trace: Path) -> Path:
    return GOLDEN / f"{name(trace)}.json"


def analyze(trace: Path, timeout: float = 300, code: Path = ROOT) -> dict:
    """`stepscope analyze TRACE --json --steps all` through the real entry point, parsed.

    `code`: the checkout whose `stepscope` package runs (`python -m stepscope` from there).
    A trace stepscope refuses as a defective capture (exit 2: e.g. the `vllm serve` capture
    stopped with SIGINT, which holds start-up only) is kept as `{"refused": {"exit", "error"}}`,
    its one line with the temporary path taken out: the refusal is an output like any other.
    """
    trace = Path(trace)
    with tempfile.TemporaryDirectory(prefix="stepscope-golden-") as tmp:
        if trace.name.endswith(".gz"):
            trace = _gunzip(trace, Path(tmp))
        p = subprocess.run(
            [sys.executable, "-m", "stepscope", "analyze", str(trace.resolve()), "--json", "--steps", "all"],
            capture_output=True, text=True, cwd=code, timeout=timeout,
        )
    if p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1:
        return {"refused": {"exit": 2, "error": p.stderr.strip().replace(str(trace.resolve()), trace.name)}}
    if p.returncode != 0:
        raise RuntimeError(f"stepscope analyze {trace} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout)


def _gunzip(path: Path, folder: Path) -> Path:
    """`x.sqlite.gz` unpacked into `folder` with its sidecar beside it (as tests/conftest.py's
    `gunzipped`); the fixture itself is never touched."""
    out = folder / path.name[: -len(".gz")]
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    side = path.parent / (out.name[: -len(".sqlite")] + ".stepscope.json")
    if side.exists():
        shutil.copy(side, folder / side.name)
    return out


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Ranked lists (by the key of the list in its parent object) and the fields they are ranked by:
# entries equal on these fields are ties, whose relative order is not a figure.
RANK_KEYS = {
    "kernels": ("time_ns", "name"),  # steps[].kernels: time desc, then name
    "top": ("gap_ns",),  # steps[].gaps.top: longest gaps first
    "by_api": ("count",),  # steps[].launch.by_api: most calls first
}


def _tie_key(item, rank: tuple[str, ...] | None) -> tuple:
    if not isinstance(item, dict):
        return ("\0scalar", json.dumps(item, sort_keys=True))
    if rank is not None:
        return tuple(item.get(k) for k in rank)
    # any other list: only entries whose figures (top-level numbers) are all equal tie
    return tuple((k, v) for k, v in sorted(item.items()) if _is_number(v) or v is None or isinstance(v, bool))


def canonical(doc):
    """Drop `trace.path`; inside every list, sort each run of ADJACENT tied entries by their
    JSON text.  Tied means equal on the list's ranking fields (RANK_KEYS: per-step `kernels`
    on time_ns and name, `gaps.top` on gap_ns, `launch.by_api` on count), or, for any other
    list, equal on every top-level number.

    The order among tied entries is not a figure: polars' group-by yields it in a
    thread-dependent order (the per-step `kernels` of nsysai_h100_2gpu_1s and pipit_cloverleaf
    differ between POLARS_MAX_THREADS=1 and 2: kernels of one short name and one total time).
    The order between entries that are not tied is kept, and compared.
    """
    doc = _canon(doc, None)
    if isinstance(doc, dict) and isinstance(doc.get("trace"), dict):
        doc["trace"] = {k: v for k, v in doc["trace"].items() if k != "path"}
    return doc


def _canon(x, key: str | None):
    if isinstance(x, dict):
        return {k: _canon(v, k) for k, v in x.items()}
    if isinstance(x, list):
        rank = RANK_KEYS.get(key)
        items = [_canon(v, None) for v in x]
        out, i = [], 0
        while i < len(items):
            j = i + 1
            tie = _tie_key(items[i], rank)
            while j < len(items) and _tie_key(items[j], rank) == tie:
                j += 1
            run = items[i:j]
            if len(run) > 1 and all(isinstance(r, dict) for r in run):
                run = sorted(run, key=lambda r: json.dumps(r, sort_keys=True))
            out.extend(run)
            i = j
        return out
    return x


def dumps(doc) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"


# A whole-run capture's document is megabytes (thousands of steps): stored whole, the golden files
# would be most of the checkout. A canonical document over SMALL bytes is stored with each list
# of more than LONG entries as a digest: its length, its first entries (each stored the same way)
# and the SHA-256 of each of CHUNKS consecutive slices of its JSON text, so that every byte is
# still compared and a difference is located to a slice.
SMALL = 64 * 1024
LONG = 32
CHUNKS = 16


def stored(doc):
    """The form a canonical document is kept in (and compared in): itself when small, else
    with its long lists digested (`_digested`)."""
    return doc if len(dumps(doc).encode("utf-8")) <= SMALL else _digested(doc)


def _sha(x) -> str:
    return hashlib.sha256(json.dumps(x, separators=(",", ":"), ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _digested(x):
    if isinstance(x, dict):
        return {k: _digested(v) for k, v in x.items()}
    if isinstance(x, list) and len(x) > LONG:
        n = len(x)
        cuts = [n * i // CHUNKS for i in range(CHUNKS + 1)]
        return {"digest_of_list": {"len": n, "head": [_digested(v) for v in x[:2]],
                                   "slices": [f"{a}:{b} {_sha(x[a:b])}" for a, b in zip(cuts, cuts[1:])]}}
    if isinstance(x, list):
        return [_digested(v) for v in x]
    return x


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Regenerate tests/golden/*.json")
    ap.add_argument("names", nargs="*", help="trace stems to regenerate (default: all)")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="checkout whose stepscope produces the documents (default: this one), e.g. "
                         "a clean `git archive HEAD` export when the working tree has changes in flight")
    args = ap.parse_args(argv)
    only = set(args.names)
    unknown = only - {name(t) for t in traces()}
    if unknown:
        ap.error(f"unknown trace(s): {', '.join(sorted(unknown))}")
    n = 0
    for trace in traces():
        if only and name(trace) not in only:
            continue
        doc = canonical(analyze(trace, code=args.code.resolve()))
        golden_path(trace).write_text(dumps(stored(doc)), encoding="utf-8")
        n += 1
        what = "refused" if "refused" in doc else f"{len(doc['steps'])} steps"
        print(f"{golden_path(trace).relative_to(ROOT)}: {what}", file=sys.stderr)
    total = sum(p.stat().st_size for p in GOLDEN.glob("*.json"))
    print(f"{n} golden file(s) written; tests/golden/*.json total {total / 2**20:.2f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
