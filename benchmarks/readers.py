#!/usr/bin/env python3
"""What reading a trace costs, by reader (issue 19's "worth measuring before deciding").

On one inflated trace (benchmarks/run.py's, 1M kernels by default), each in a fresh process,
median of --reps, times taken inside the child (perf_counter around each stage):

    import polars / import duckdb (+ the bundled sqlite_scanner) / python -c pass
    stepscope's reader: read_nsys_sqlite(launch_config=False), what `analyze` reads, by each of
        its paths in turn (ADBC, and the stdlib sqlite3 that reads where ADBC is absent), and
        with --before DIR the same read by another checkout (e.g. `git archive REV stepscope
        pyproject.toml | tar -x -C DIR`, with whatever it builds built there), in the same rounds
    DuckDB sqlite_scanner: the kernel columns stepscope reads, and the runtime table unfiltered
        and filtered to the API names stepscope keeps, each alone and both at once on two
        cursors in two threads, into Arrow

    python benchmarks/readers.py [--size 1M] [--reps 5] [--before DIR] [--no-duckdb]   # a Markdown section

needs `pip install duckdb==1.5.5 duckdb-extension-sqlite-scanner==1.5.5 duckdb-extensions`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inflate as _inflate  # noqa: E402

REPO = HERE.parent

STEPSCOPE = r"""
import json, sys, time
t0 = time.perf_counter()
import stepscope.ingest.nsys_sqlite as ns
from stepscope.ingest.nsys_sqlite import read_nsys_sqlite
if sys.argv[2] == "sqlite3":  # the path a user without adbc-driver-sqlite gets
    ns._attach_adbc = lambda con, path: None
t1 = time.perf_counter()
tr = read_nsys_sqlite(sys.argv[1], launch_config=False)
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "read": t2 - t1, "kernels": tr.kernels.height, "api": tr.api.height}))
"""

DUCKDB = r"""
import json, sys, threading, time
t0 = time.perf_counter()
import duckdb, duckdb_extensions
duckdb_extensions.import_extension("sqlite_scanner")
con = duckdb.connect()
con.execute("LOAD sqlite_scanner")
con.execute("SET threads = 2")
t1 = time.perf_counter()
p = sys.argv[1].replace("'", "''")
from stepscope.apinames import KEPT
glob = " OR ".join(f"value GLOB '{k}*'" for k in KEPT)
ids = [r[0] for r in con.execute(f"SELECT id FROM sqlite_scan('{p}', 'StringIds') WHERE {glob}").fetchall()]
K = (f"SELECT globalPid, deviceId, streamId, correlationId, start, \"end\", shortName, demangledName "
     f"FROM sqlite_scan('{p}', 'CUPTI_ACTIVITY_KIND_KERNEL')")
R = f"SELECT globalTid, correlationId, start, \"end\", nameId FROM sqlite_scan('{p}', 'CUPTI_ACTIVITY_KIND_RUNTIME')"
RF = R + f" WHERE nameId IN ({','.join(map(str, ids)) or 'NULL'})"
t2 = time.perf_counter()
out = {"import+setup": t1 - t0, "string ids": t2 - t1}
def run(q):
    return con.cursor().execute(q).fetch_arrow_table()
for name, q in (("kernels", K), ("runtime", R), ("runtime filtered", RF)):
    t = time.perf_counter(); tab = run(q); out[name] = time.perf_counter() - t; out[name + " rows"] = tab.num_rows
for name, qs in (("kernels || runtime", (K, R)), ("kernels || runtime filtered", (K, RF))):
    t = time.perf_counter()
    th = [threading.Thread(target=run, args=(q,)) for q in qs]
    [x.start() for x in th]; [x.join() for x in th]
    out[name] = time.perf_counter() - t
print(json.dumps(out))
"""

IMPORTS = {"python -c pass": "pass", "import polars": "import polars",
           "import duckdb + sqlite_scanner": "import duckdb, duckdb_extensions; "
                                             "duckdb_extensions.import_extension('sqlite_scanner')"}


# stepscope's read paths (ingest/nsys_sqlite.py): ADBC's Arrow stream, or sqlite3 without the driver
PATHS = ("ADBC", "sqlite3")


def child(code: str, *args: str, root: Path = REPO) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # run in `root`: `-c` puts the current folder first on sys.path, ahead of PYTHONPATH
    cp = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                        timeout=600, cwd=root)
    if cp.returncode != 0:
        raise SystemExit(f"child failed: {cp.stderr.strip()[-500:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def wall(code: str) -> float:
    import time

    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=_inflate.DEFAULT_OUT)
    ap.add_argument("--source", type=Path, default=_inflate.DEFAULT_SOURCE)
    ap.add_argument("--results", type=Path, default=HERE / "readers.md")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--before", type=Path, help="another checkout whose reader is timed too (its default path)")
    ap.add_argument("--no-duckdb", action="store_true", help="leave DuckDB's sqlite_scanner out")
    args = ap.parse_args(argv)
    inf = _inflate.inflate(args.source, _inflate.parse_size(args.size), args.out)
    path = str(inf.path)
    load0 = os.getloadavg()[0]
    lines = [f"### Readers on {inf.n_kernels:,} kernels ({Path(path).name}), median of {args.reps} fresh processes",
             "", "| what | seconds |", "|---|---|"]
    for name, code in IMPORTS.items():
        if args.no_duckdb and "duckdb" in name:
            continue
        lines.append(f"| `{name}` (process wall) | {statistics.median(wall(code) for _ in range(args.reps)):.3f} |")
    paths = [(p, p, REPO) for p in PATHS]
    if args.before:
        paths.append((f"before, {args.before.name}", "default", args.before.resolve()))
    by_path: dict[str, list[dict]] = {label: [] for label, _, _ in paths}
    for _ in range(args.reps):  # the paths in turn, round after round
        for label, how, root in paths:
            by_path[label].append(child(STEPSCOPE, path, how, root=root))
    measured = [(f"stepscope ({p})", runs) for p, runs in by_path.items()]
    if not args.no_duckdb:
        measured.append(("duckdb", [child(DUCKDB, path) for _ in range(args.reps)]))
    for label, runs in measured:
        for k in runs[0]:
            v = statistics.median(r[k] for r in runs)
            lines.append(f"| {label}: {k} | {v:,.3f} |" if isinstance(v, float) else f"| {label}: {k} | {v:,} |")
    lines += ["", f"load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
              "`python benchmarks/readers.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.results.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
