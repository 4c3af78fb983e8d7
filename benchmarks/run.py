#!/usr/bin/env python3
"""Benchmark `stepscope analyze --json --steps all` against the raw-scan floor and nsys-ai.

For each size (kernels), the source fixture is inflated (benchmarks/inflate.py, reused when
up to date) and three things are timed in the same run:

* floor    - Python sqlite3, fresh read-only connection:
             SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
             JOIN StringIds s ON s.id = k.shortName
* floor2   - the floor of what the job reads (issue 19): the same kernel scan plus
             SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME
             on the same connection (the launch calls are the job's other table)
* stepscope - `python -m stepscope analyze FILE --json --steps all` (plus `--no-cache` when the
             CLI has that option), a fresh process per repetition, stdout to a file
* stepscope (warm) - the same command without --no-cache, after one run that wrote the
             Parquet cache beside the export (the cache is removed afterwards)
* nsys-ai  - `nsys-ai summary FILE` with NSYS_AI_CACHE_MODE=direct, a fresh process per
             repetition, when nsys-ai is installed (its Parquet cache dir is removed first)

Wall is the median over the repetitions; peak RSS is the child's ru_maxrss from os.wait4 in
a small launcher process (see LAUNCHER: a child of this process would report at least this
process's own RSS).  Writes benchmarks/results.md.

    python benchmarks/run.py                       # 10k,100k,1M
    python benchmarks/run.py --sizes 10k,100k,1M,5M
    python benchmarks/run.py --with-5m --tp2       # + 5M, + the TP=2 (2 processes/GPUs) fixture
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import inflate as _inflate  # noqa: E402

FLOOR_SQL = (
    "SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
    "JOIN StringIds s ON s.id = k.shortName"
)
RUNTIME_FLOOR_SQL = "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME"
TP2_SOURCE = REPO / "fixtures" / "llama8b_decode_b1_eager_tp2.sqlite"


# --------------------------------------------------------------------------- measuring


@dataclass
class Run:
    wall_s: float
    maxrss_bytes: int
    rc: int


@dataclass
class Row:
    trace: str
    size_label: str
    kernels: int
    tool: str
    runs: list[Run] = field(default_factory=list)
    note: str = ""

    @property
    def ok_runs(self) -> list[Run]:
        return [r for r in self.runs if r.rc == 0]

    @property
    def wall(self) -> float | None:
        ok = self.ok_runs
        return statistics.median(r.wall_s for r in ok) if ok else None

    @property
    def rss(self) -> int | None:
        ok = [r for r in self.ok_runs if r.maxrss_bytes > 0]
        return max(r.maxrss_bytes for r in ok) if ok else None


CODE = REPO  # where stepscope children run (set from --code)


# Peak RSS must be the tool's own. Linux carries a process's RSS high-water mark into what its
# children report: a child forked from this process starts at this process's RSS, which grows
# (inflating traces, reading JSON documents) as the run goes on. So every tool runs under a tiny
# fresh interpreter that times and reaps it and writes "wall maxrss_kib exit_code" to a pipe.
LAUNCHER = """
import os, sys, time
fd, argv = int(sys.argv[1]), sys.argv[2:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
os.write(fd, f"{wall!r} {ru.ru_maxrss} {os.waitstatus_to_exitcode(status)}".encode())
"""


def child_env(**extra: str) -> dict:
    """The children's environment: ours, less PYTHONDONTWRITEBYTECODE, so that the warm-up run
    writes stepscope's bytecode as an installed package has it (set, as on this project's boxes,
    every run compiled the whole package again: 0.25 s of CPU, 0.3-0.5 s of wall on the 2-core box)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def run_child(cmd: list[str], env: dict | None = None, stdout_path: Path | None = None,
              timeout_s: float = 900, cwd: Path | None = None) -> tuple[Run, str]:
    """Run one fresh child under LAUNCHER; wall from its fork to its reap, peak RSS from the
    launcher's os.wait4 (ru_maxrss, KiB on Linux)."""
    out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    err = tempfile.TemporaryFile()
    r_fd, w_fd = os.pipe()
    try:
        p = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, str(w_fd), *cmd], stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, env=env, cwd=cwd or CODE, start_new_session=True,
                             pass_fds=(w_fd,))
        os.close(w_fd)
        w_fd = -1
        killer = threading.Timer(timeout_s, lambda: os.killpg(p.pid, signal.SIGKILL))
        killer.start()
        try:
            report = b""
            while chunk := os.read(r_fd, 4096):
                report += chunk
            p.wait()
        finally:
            killer.cancel()
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace")
        if p.returncode != 0 or not report:  # killed (timeout) or the launcher itself failed
            return Run(0.0, 0, p.returncode or 1), tail
        wall, maxrss_kib, rc = report.split()
        return Run(float(wall), int(maxrss_kib) * 1024, int(rc)), tail
    finally:
        if w_fd >= 0:
            os.close(w_fd)
        os.close(r_fd)
        if stdout_path:
            out.close()
        err.close()


def floor_scan(path: str, both: bool = False) -> tuple[float, tuple]:
    """The raw scan of the kernel table (with `both`, and of the runtime table) in seconds."""
    t0 = time.perf_counter()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        res = con.execute(FLOOR_SQL).fetchone()
        if both:
            res = res + con.execute(RUNTIME_FLOOR_SQL).fetchone()
    finally:
        con.close()
    return time.perf_counter() - t0, res


# --------------------------------------------------------------------------- tools


def stepscope_cmd(base: list[str]) -> tuple[list[str], bool]:
    """analyze command; adds --no-cache when the CLI has it."""
    r = subprocess.run(base + ["analyze", "--help"], capture_output=True, text=True, cwd=CODE,
                       env=dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb"))
    has_no_cache = "--no-cache" in (r.stdout + r.stderr)
    return base + ["analyze"], has_no_cache


def nsys_ai_setup() -> tuple[str | None, str]:
    """Path of nsys-ai and a note. Loads the bundled sqlite_scanner extension once."""
    exe = shutil.which("nsys-ai")
    if not exe:
        return None, "nsys-ai not installed (pip install nsys-ai==0.3.0)"
    note = []
    try:
        import duckdb_extensions  # type: ignore

        duckdb_extensions.import_extension("sqlite_scanner")
    except Exception as e:  # noqa: BLE001
        note.append(f"duckdb_extensions.import_extension('sqlite_scanner') failed: {e}")
    try:
        import duckdb  # type: ignore

        duckdb.connect().execute("LOAD sqlite_scanner")
    except Exception as e:  # noqa: BLE001
        note.append(f"sqlite_scanner does not load ({e}); nsys-ai falls back or fails")
    return exe, "; ".join(note)


def nsys_ai_cache_dir(path: str) -> Path:
    # nsys_ai.parquet_cache._cache_dir_for (0.3.0): the export's path with suffix .nsys-cache
    return Path(path).with_suffix(".nsys-cache")


def parse_nsys_ai_kernels(text: str) -> int | None:
    counts = [int(m) for m in re.findall(r"^\s*Kernels:\s*(\d+)", text, re.M)]
    return sum(counts) if counts else None


# --------------------------------------------------------------------------- machine


def machine_info(code: Path) -> dict:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    model = ""
    for line in sh("lscpu").splitlines():
        if line.lower().startswith("model name"):
            model = line.split(":", 1)[1].strip()
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    versions = {}
    for mod in ("polars", "duckdb", "typer"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = "not installed"
    try:
        from importlib.metadata import version

        versions["nsys-ai"] = version("nsys-ai")
    except Exception:  # noqa: BLE001
        # installed elsewhere (its own venv on PATH): ask the python beside its executable
        exe = shutil.which("nsys-ai")
        py = Path(exe).with_name("python") if exe else None
        got = sh(f"{py} -c 'import importlib.metadata as m; print(m.version(\"nsys-ai\"))'") if py and py.exists() else ""
        versions["nsys-ai"] = f"{got} ({exe})" if got else "not installed"
    if code != REPO:
        commit = f"the stepscope package in {code} (--code), run on traces from {sh(f'git -C {REPO} rev-parse --short HEAD')}"
        dirty = ""
    else:
        commit = sh(f"git -C {REPO} rev-parse --short HEAD")
        dirty = sh(f"git -C {REPO} status --porcelain -- stepscope")
    return {
        "nproc": sh("nproc"),
        "cpu": model,
        "ram": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        **versions,
        "commit": commit + (f" + {len(dirty.splitlines())} uncommitted file(s) in stepscope/" if dirty else ""),
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


# --------------------------------------------------------------------------- report


def fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}"


def fmt_mib(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**20:,.0f}"


def table(rows: list[Row], baseline_rss: dict[tuple[str, str], int]) -> str:
    head = ("| trace | kernels | tool | median wall (s) | min–max (s) | peak RSS (MiB) | "
            "ΔRSS B/kernel | kernels/s | × floor | × floor2 | nsys-ai ÷ tool |")
    sep = "|" + "---|" * 11
    lines = [head, sep]
    groups: dict[tuple[str, int], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.trace, r.kernels), []).append(r)
    for (trace, kernels), grp in groups.items():
        floor = next((g.wall for g in grp if g.tool == "floor"), None)
        floor2 = next((g.wall for g in grp if g.tool == "floor2"), None)
        nsys = next((g.wall for g in grp if g.tool == "nsys-ai"), None)
        for g in grp:
            w = g.wall
            ok = g.ok_runs
            rng = f"{min(r.wall_s for r in ok):.3f}–{max(r.wall_s for r in ok):.3f}" if ok else "—"
            rss = g.rss
            base = baseline_rss.get((trace, g.tool))
            per_k = "—" if rss is None or base is None else f"{(rss - base) / kernels:,.0f}"
            kps = "—" if not w else f"{kernels / w:,.0f}"
            xf = "—" if not (w and floor) or g.tool == "floor" else f"{w / floor:.1f}×"
            xf2 = "—" if not (w and floor2) or g.tool.startswith("floor") else f"{w / floor2:.1f}×"
            vs = "—" if not (w and nsys) or g.tool in ("floor", "nsys-ai") else f"{nsys / w:.2f}×"
            tool = g.tool + (f" ({g.note})" if g.note else "")
            lines.append(f"| {trace} | {kernels:,} | {tool} | {fmt_s(w)} | {rng} | {fmt_mib(rss)} | "
                         f"{per_k} | {kps} | {xf} | {xf2} | {vs} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10k,100k,1M", help="comma list of kernel counts")
    ap.add_argument("--with-5m", action="store_true", help="add 5M kernels to --sizes")
    ap.add_argument("--source", type=Path, action="append",
                    help="fixture(s) to inflate (default fixtures/llama8b_decode_b1_eager.sqlite)")
    ap.add_argument("--tp2", action="store_true",
                    help="also the TP=2 fixture (2 processes / 2 GPUs): llama8b_decode_b1_eager_tp2")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of stepscope and nsys-ai")
    ap.add_argument("--floor-reps", type=int, default=5, help="repetitions of the raw scan")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm (Parquet cache) runs")
    ap.add_argument("--startup-reps", type=int, default=10, help="repetitions of `stepscope --help`")
    ap.add_argument("--no-nsys-ai", action="store_true", help="skip nsys-ai even when installed")
    ap.add_argument("--out", type=Path, default=_inflate.DEFAULT_OUT, help="inflated traces folder")
    ap.add_argument("--results", type=Path, default=HERE / "results.md", help="Markdown output")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    ap.add_argument("--stepscope", default=f"{sys.executable} -m stepscope",
                    help="command that runs stepscope (default: this Python, -m, run from --code)")
    ap.add_argument("--code", type=Path, default=REPO,
                    help="checkout whose stepscope package is benchmarked (the folder `python -m "
                         "stepscope` runs in; default this repo's working tree), e.g. a `git archive` "
                         "export of a commit to measure a baseline")
    args = ap.parse_args(argv)
    global CODE
    CODE = args.code.resolve()
    args.out = args.out.resolve()

    sizes = [_inflate.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.with_5m and 5_000_000 not in sizes:
        sizes.append(5_000_000)
    sources = list(args.source or [_inflate.DEFAULT_SOURCE])
    if args.tp2 and TP2_SOURCE not in sources:
        sources.append(TP2_SOURCE)

    env_base = child_env(NO_COLOR="1", TERM="dumb")
    ss_base = args.stepscope.split()
    ss_analyze, has_no_cache = stepscope_cmd(ss_base)
    ss_extra = ["--json", "--steps", "all"] + (["--no-cache"] if has_no_cache else [])
    nsys_exe, nsys_note = (None, "skipped (--no-nsys-ai)") if args.no_nsys_ai else nsys_ai_setup()
    nsys_env = dict(env_base, NSYS_AI_CACHE_MODE="direct")
    print(f"stepscope: {' '.join(ss_analyze + ['FILE'] + ss_extra)}", file=sys.stderr)
    print(f"nsys-ai:   {nsys_exe or '-'} {nsys_note}", file=sys.stderr)

    load_start = os.getloadavg()
    tmpdir = Path(tempfile.mkdtemp(prefix="stepscope-bench-"))
    rows: list[Row] = []
    problems: list[str] = []
    baseline_rss: dict[tuple[str, str], int] = {}
    startup: dict[str, float] = {}
    try:
        # Start-up: `stepscope --help` and a bare interpreter, fresh processes.
        for name, cmd in (("python -c pass", [sys.executable, "-c", "pass"]),
                          ("stepscope --help", ss_base + ["--help"])):
            walls = []
            for _ in range(args.startup_reps):
                r, _ = run_child(cmd, env_base)
                walls.append(r.wall_s)
            startup[name] = statistics.median(walls)
            print(f"start-up {name}: median {startup[name]:.3f} s", file=sys.stderr)

        for src in sources:
            src = Path(src)
            # Warm-up on the real fixture (compiles .pyc; its peak RSS is the "interpreter" baseline).
            base_out = tmpdir / "base.json"
            r, tail = run_child(ss_analyze + [str(src)] + ss_extra, env_base, base_out)
            if r.rc != 0:
                problems.append(f"stepscope failed on {src.name}: {tail.strip()[-400:]}")
                base_steps = base_kernels_in_steps = None
            else:
                baseline_rss[(src.stem, "stepscope")] = r.maxrss_bytes
                d = json.loads(base_out.read_text())
                base_steps = len(d["steps"])
                base_kernels_in_steps = sum(s["n_kernels"] for s in d["steps"])
            if nsys_exe:
                r, tail = run_child([nsys_exe, "summary", str(src)], nsys_env)
                if r.rc == 0:
                    baseline_rss[(src.stem, "nsys-ai")] = r.maxrss_bytes

            for n in sizes:
                inf = _inflate.inflate(src, n, args.out)
                path, kernels, label = inf.path, inf.n_kernels, _inflate.size_label(n)
                trace = src.stem
                print(f"== {trace} {label}: {kernels:,} kernels ({Path(path).stat().st_size / 2**20:.0f} MiB)",
                      file=sys.stderr)

                # floor
                frow = Row(trace, label, kernels, "floor")
                for _ in range(args.floor_reps):
                    w, res = floor_scan(path)
                    frow.runs.append(Run(w, 0, 0))
                if res[0] != kernels:
                    problems.append(f"floor counted {res[0]} kernels in {path}, expected {kernels}")
                rows.append(frow)
                print(f"   floor     {frow.wall:.3f} s", file=sys.stderr)
                f2 = Row(trace, label, kernels, "floor2")
                for _ in range(args.floor_reps):
                    w, _res = floor_scan(path, both=True)
                    f2.runs.append(Run(w, 0, 0))
                rows.append(f2)
                print(f"   floor2    {f2.wall:.3f} s", file=sys.stderr)

                # stepscope, cold (--no-cache), then warm (the Parquet cache a first run wrote)
                out_json = tmpdir / "out.json"

                def timed(row: Row, extra: list[str], check) -> Row:
                    for i in range(args.reps):
                        r, tail = run_child(ss_analyze + [path] + extra, env_base, out_json,
                                            timeout_s=args.timeout)
                        row.runs.append(r)
                        if r.rc != 0:
                            problems.append(f"{row.tool}{f' ({row.note})' if row.note else ''} rc={r.rc} on "
                                            f"{Path(path).name}: {tail.strip()[-400:]}")
                            break
                        if i == 0 and check:
                            check()
                        out_json.unlink(missing_ok=True)
                    rows.append(row)
                    print(f"   {row.note or row.tool:<9} {fmt_s(row.wall)} s, {fmt_mib(row.rss)} MiB", file=sys.stderr)
                    return row

                def check_steps() -> None:
                    if base_steps is None:
                        return
                    d = json.loads(out_json.read_text())
                    got_steps = len(d["steps"])
                    got_k = sum(s["n_kernels"] for s in d["steps"])
                    if got_steps != inf.copies * base_steps or got_k != inf.copies * base_kernels_in_steps:
                        problems.append(
                            f"stepscope on {Path(path).name}: {got_steps} steps / {got_k} kernels in steps, "
                            f"expected {inf.copies * base_steps} / {inf.copies * base_kernels_in_steps}")

                timed(Row(trace, label, kernels, "stepscope"), ss_extra, check_steps)
                if has_no_cache and not args.no_warm:
                    warm_extra = [a for a in ss_extra if a != "--no-cache"]
                    cache_dir = Path(path).parent / ".stepscope-cache"
                    shutil.rmtree(cache_dir, ignore_errors=True)
                    run_child(ss_analyze + [path] + warm_extra, env_base, out_json, timeout_s=args.timeout)
                    timed(Row(trace, label, kernels, "stepscope", note="warm"), warm_extra, None)
                    shutil.rmtree(cache_dir, ignore_errors=True)

                # nsys-ai
                if nsys_exe:
                    nrow = Row(trace, label, kernels, "nsys-ai")
                    out_txt = tmpdir / "nsys.txt"
                    for i in range(args.reps):
                        cache = nsys_ai_cache_dir(path)
                        if cache.exists():
                            shutil.rmtree(cache)
                        r, tail = run_child([nsys_exe, "summary", path], nsys_env, out_txt,
                                            timeout_s=args.timeout)
                        nrow.runs.append(r)
                        text = out_txt.read_text(errors="replace")
                        if r.rc != 0:
                            problems.append(f"nsys-ai rc={r.rc} on {Path(path).name}: {tail.strip()[-400:]}")
                            break
                        if i == 0:
                            nk = parse_nsys_ai_kernels(text)
                            if nk != kernels:
                                problems.append(f"nsys-ai summary reported {nk} kernels on {Path(path).name}, "
                                                f"expected {kernels}")
                    rows.append(nrow)
                    print(f"   nsys-ai   {fmt_s(nrow.wall)} s, {fmt_mib(nrow.rss)} MiB", file=sys.stderr)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    load_end = os.getloadavg()
    md_table = table(rows, baseline_rss)
    print(md_table)
    print()
    for k, v in startup.items():
        print(f"start-up `{k}`: median of {args.startup_reps}: {v:.3f} s")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)

    if not args.no_write:
        m = machine_info(CODE)
        lines = [
            "# stepscope benchmark results",
            "",
            "Generated by `python benchmarks/run.py "
            + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
            + "` — see benchmarks/README.md for what each column means.",
            "",
            "## Machine",
            "",
            f"- CPU: {m['cpu']}, `nproc` = {m['nproc']}; RAM {m['ram']}; Linux {m['kernel']}",
            f"- Python {m['python']}, polars {m['polars']}, SQLite {m['sqlite']}, "
            f"duckdb {m['duckdb']}, nsys-ai {m['nsys-ai']}",
            f"- stepscope at {m['commit']}; run on {m['date']}",
            f"- stepscope command: `{' '.join(ss_analyze)} FILE {' '.join(ss_extra)}`"
            + ("" if has_no_cache else " (the CLI has no `--no-cache` option yet: every run is cold anyway)"),
            "- nsys-ai command: `NSYS_AI_CACHE_MODE=direct nsys-ai summary FILE`"
            + (f" — {nsys_note}" if nsys_note else ""),
            f"- repetitions: {args.reps} (stepscope, nsys-ai; fresh process each), "
            f"{args.floor_reps} (floor); the inflated files are in the OS page cache for every tool",
            f"- 1-min load average at start / end: {load_start[0]:.2f} / {load_end[0]:.2f} on {m['nproc']} cores "
            "(above ~1 means something else was running: the spread and the medians suffer)",
            "",
            "## Results",
            "",
            md_table,
            "",
            "## Start-up",
            "",
        ]
        for k, v in startup.items():
            lines.append(f"- `{k}`: median of {args.startup_reps} fresh processes: {v:.3f} s")
        base_lines = [f"{t} on {tr}: {v / 2**20:.0f} MiB" for (tr, t), v in baseline_rss.items()]
        lines += ["", "ΔRSS baseline (peak RSS on the un-inflated source fixture): "
                  + (", ".join(base_lines) or "—")]
        if problems:
            lines += ["", "## Problems seen in this run", ""] + [f"- {p}" for p in problems]
        args.results.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.results}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
