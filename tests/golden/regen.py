#!/usr/bin/env python3
"""Regenerate the golden `stepscope analyze --json --steps all` documents in tests/golden/.

    python tests/golden/regen.py            # every committed fixture + ../shared/external/*.sqlite
    python tests/golden/regen.py NAME ...   # only these (file stems)
    python tests/golden/regen.py --code DIR # run the stepscope of another checkout (e.g. a clean
                                            # `git archive HEAD` export) on this repo's traces

Run it only when a figure is *meant* to change, and say why in the commit: these files are what
tests/test_golden_json.py holds the analyzer to ("no figure changes when the data path changes").

Stored form (`canonical`): the JSON document minus the machine-specific `trace.path`, with the
order of tied entries normalized (see `canonical`), written compact (no indentation), one file
per trace: tests/golden/<trace stem>.json.  Floats are stored as Python writes them (repr, exact
round trip) and compared exactly.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
ROOT = GOLDEN.parent.parent
FIXTURES = ROOT / "fixtures"
EXTERNAL = Path(os.environ.get("STEPSCOPE_EXTERNAL") or ROOT.parent / "shared" / "external")  # as tests/conftest.py


def traces() -> list[Path]:
    """Every committed fixture `fixtures/llama8b_*.sqlite` and every foreign export present."""
    return sorted(FIXTURES.glob("llama8b_*.sqlite")) + sorted(EXTERNAL.glob("*.sqlite"))


def golden_path(trace: Path) -> Path:
    return GOLDEN / f"{Path(trace).stem}.json"


def analyze(trace: Path, timeout: float = 300, code: Path = ROOT) -> dict:
    """`stepscope analyze TRACE --json --steps all` through the real entry point, parsed.

    `code`: the checkout whose `stepscope` package runs (`python -m stepscope` from there).
    """
    p = subprocess.run(
        [sys.executable, "-m", "stepscope", "analyze", str(Path(trace).resolve()), "--json", "--steps", "all"],
        capture_output=True, text=True, cwd=code, timeout=timeout,
    )
    if p.returncode != 0:
        raise RuntimeError(f"stepscope analyze {trace} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout)


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


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Regenerate tests/golden/*.json")
    ap.add_argument("names", nargs="*", help="trace stems to regenerate (default: all)")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="checkout whose stepscope produces the documents (default: this one), e.g. "
                         "a clean `git archive HEAD` export when the working tree has changes in flight")
    args = ap.parse_args(argv)
    only = set(args.names)
    unknown = only - {t.stem for t in traces()}
    if unknown:
        ap.error(f"unknown trace(s): {', '.join(sorted(unknown))}")
    n = 0
    for trace in traces():
        if only and trace.stem not in only:
            continue
        doc = canonical(analyze(trace, code=args.code.resolve()))
        golden_path(trace).write_text(dumps(doc), encoding="utf-8")
        n += 1
        print(f"{golden_path(trace).relative_to(ROOT)}: {len(doc['steps'])} steps", file=sys.stderr)
    total = sum(p.stat().st_size for p in GOLDEN.glob("*.json"))
    print(f"{n} golden file(s) written; tests/golden/*.json total {total / 2**20:.2f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
