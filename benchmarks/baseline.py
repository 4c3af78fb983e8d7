#!/usr/bin/env python3
"""The working tree against a recorded baseline commit, as a ratio, in ONE interleaved run.

On a shared, noisy machine two benchmark runs an hour apart cannot be compared; two pieces of
code timed in turns (A B A B ...) over the same input in the same minutes can. For each trace
and mode this runs `python -m stepscope analyze TRACE --json --steps all` (`--no-cache` when
cold) from each checkout in turn, a fresh process each, and reports per checkout the median
wall, its min-max, the peak RSS (ru_maxrss through run.py's launcher), the ratio of the medians
to the baseline's and of the two-table SQLite floor (`floor2`, run.py's) timed between the same
repetitions, and whether their JSON documents are byte-identical.

The baseline (default 0b36d97, the code before issue 31's 40 %; `--baseline main` for the
current main tip) is extracted with `git archive REV` into a temporary folder, which leaves the
repository's worktree list alone; `--also REV` adds more commits, for a bisection. Not a test:
nothing under pytest runs it.

    python benchmarks/baseline.py                                   # 1M, cold and warm, 5 rounds
    python benchmarks/baseline.py --baseline main --reps 7
    python benchmarks/baseline.py --also e20021d --also f52d16b --modes cold
    python benchmarks/baseline.py --trace bench-out/x.sqlite --trace bench-out/y.arrows
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import inflate as _inflate  # noqa: E402
import run as _run  # noqa: E402

DEFAULT_BASELINE = "0b36d97"
# a step named just `step` (no phase recorded: every step takes its phase from the evidence,
# the held-out trace's case) and one named `step phase=decode ...`
DEFAULT_SOURCES = ("fixtures/round5/llama8b_decode_b1_bare.sqlite", "fixtures/llama8b_decode_b1_eager.sqlite")


NATIVE = Path("stepscope/ingest/_scan.c")  # the compiled reader's source, at commits that have one


def checkout(rev: str, into: Path) -> tuple[Path, str]:
    """`rev`'s stepscope package (and pyproject) under `into`/<short sha>, with its compiled
    reader built as `pip install` builds it (an archive holds no built module: without it the
    commit would be timed reading through ADBC), and a word on that module for the table."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    dest = into / sha
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "stepscope", "pyproject.toml"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest, build_native(dest, sha)


def build_native(code: Path, label: str) -> str:
    """Compile `code`'s _scan.c in place with the interpreter's own compiler and flags."""
    import sysconfig

    src = code / NATIVE
    if not src.exists():
        return f"{label}: no compiled reader at that commit"
    cfg = sysconfig.get_config_var
    out = src.with_name("_scan" + cfg("EXT_SUFFIX"))
    cmd = [*(cfg("CC") or "cc").split(), *(cfg("CFLAGS") or "").split(), *(cfg("CCSHARED") or "-fPIC").split(),
           "-shared", f"-I{sysconfig.get_paths()['include']}", str(src), "-lsqlite3", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return f"{label}: its compiled reader failed to build ({r.stderr.strip()[:200]}): read through ADBC"
    return f"{label}: compiled reader built"


def native_state(code: Path) -> str:
    """Whether the working tree's compiled reader is built beside its source."""
    src = code / NATIVE
    if not src.exists():
        return "tree: no compiled reader"
    return "tree: compiled reader built" if list(src.parent.glob("_scan*.so")) else \
        "tree: compiled reader NOT built (read through ADBC)"


# run.py's launcher, also reporting the child's CPU time (user + system): on a shared box the
# wall of one run moves with the load, its CPU time much less
LAUNCHER = _run.LAUNCHER.replace("{ru.ru_maxrss}", "{ru.ru_maxrss} {ru.ru_utime + ru.ru_stime!r}")


@dataclass
class Timed:
    wall_s: float
    cpu_s: float
    maxrss_bytes: int
    rc: int


def timed(code: Path, trace: Path, cold: bool, out: Path, timeout_s: float = 900) -> Timed:
    """One fresh run of `code`'s CLI on `trace`, in out's folder: every checkout runs in the same
    folder, or (warm) in a folder of its own on the export under the same relative name, so that
    the path its document shows is the same (a checkout's own folder made the tree's relative and
    the others' absolute: "DIFFERS" on equal documents)."""
    cmd = [sys.executable, "-m", "stepscope", "analyze", str(trace), "--json", "--steps", "all"]
    if cold:
        cmd.append("--no-cache")
    env = _run.child_env(PYTHONPATH=str(code))
    r_fd, w_fd = os.pipe()
    with open(out, "wb") as stdout, tempfile.TemporaryFile() as err:
        try:
            p = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, str(w_fd), *cmd], stdout=stdout, stderr=err,
                                 stdin=subprocess.DEVNULL, env=env, cwd=out.parent, pass_fds=(w_fd,))
            os.close(w_fd)
            report = b""
            while chunk := os.read(r_fd, 4096):
                report += chunk
            p.wait(timeout_s)
        finally:
            os.close(r_fd)
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace")
    if p.returncode != 0 or not report:
        print(f"   {code.name}: launcher exit {p.returncode}: {tail.strip()[-300:]}", file=sys.stderr)
        return Timed(0.0, 0.0, 0, p.returncode or 1)
    wall, maxrss_kib, cpu, rc = report.split()
    if int(rc) != 0:
        print(f"   {code.name}: exit {rc}: {tail.strip()[-300:]}", file=sys.stderr)
    return Timed(float(wall), float(cpu), int(maxrss_kib) * 1024, int(rc))


def _link(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy(src, dst)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="the commit to compare against (default %(default)s)")
    ap.add_argument("--also", action="append", default=[], help="more commits, timed in the same rounds")
    ap.add_argument("--code", default=str(REPO), help="the checkout under test (default: this working tree)")
    ap.add_argument("--trace", action="append", default=[], help="an export to time (default: the inflated sources)")
    ap.add_argument("--source", action="append", default=[], help="fixtures to inflate (default: bare and eager)")
    ap.add_argument("--size", default="1M", help="kernels of the inflated sources (default %(default)s)")
    ap.add_argument("--modes", default="cold,warm", help="cold (--no-cache), warm (the cache a first run wrote)")
    ap.add_argument("--reps", type=int, default=5, help="rounds of A B ... per trace and mode (default %(default)s)")
    ap.add_argument("--out", default=str(REPO / "bench-out"), help="inflated traces (default bench-out/)")
    ap.add_argument("--results", default=str(HERE / "baseline.md"), help="the table's file (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)

    traces = [Path(t).resolve() for t in args.trace]  # each checkout runs in its own folder
    if not traces:
        for src in args.source or DEFAULT_SOURCES:
            info = _inflate.inflate(REPO / src, _inflate.parse_size(args.size), Path(args.out), quiet=True)
            traces.append(Path(info.path))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-baseline-"))
    try:
        codes = [("tree", Path(args.code).resolve())]
        natives = [native_state(codes[0][1])]
        for rev in [args.baseline, *args.also]:
            dest, note = checkout(rev, tmp)
            codes.append((rev, dest))
            natives.append(note)
        print("# " + "; ".join(natives), file=sys.stderr)
        base_label = args.baseline
        for _, code in codes:  # each checkout's bytecode written once, as an installed package has it
            timed(code, (REPO / DEFAULT_SOURCES[1]).resolve(), True, tmp / "warmup.json")
        rows = []
        load0 = os.getloadavg()[0]
        for trace in traces:
            for mode in modes:
                cold = mode == "cold"
                # warm: each checkout reads the export in a folder of its own, under the same name
                # (a hard link), so that it keeps its own cache entry: a shared one holds one kept
                # analysis, and two checkouts with different code would replace each other's on
                # every run (each "warm" run a miss)
                where = {label: tmp for label, _ in codes}
                if not cold:
                    for i, (label, code) in enumerate(codes):
                        where[label] = tmp / f"warm-{i}"
                        where[label].mkdir(exist_ok=True)
                        _link(trace, where[label] / trace.name)
                        # each checkout writes (or finds) its cache entry first
                        timed(code, Path(trace.name), False, where[label] / "warmup.json")
                runs: dict[str, list[Timed]] = {label: [] for label, _ in codes}
                floors: list[float] = []
                digests: dict[str, set[str]] = {label: set() for label, _ in codes}
                for i in range(args.reps):
                    # the order turns every round, so neither side always runs first
                    order = codes[i % len(codes):] + codes[:i % len(codes)]
                    for label, code in order:
                        out = where[label] / f"{code.name}.json"
                        r = timed(code, trace if cold else Path(trace.name), cold, out)
                        runs[label].append(r)
                        if r.rc == 0:
                            digests[label].add(digest(out))
                    floors.append(_run.floor_scan(str(trace), both=True)[0] if trace.suffix == ".sqlite" else 0.0)
                    print(f"  {trace.name} {mode} round {i + 1}: " + ", ".join(
                        f"{label} {runs[label][-1].wall_s:.2f} s" for label, _ in codes), file=sys.stderr)
                floor2 = statistics.median(floors)
                base_med = statistics.median(r.wall_s for r in runs[base_label] if r.rc == 0)
                base_cpu = statistics.median(r.cpu_s for r in runs[base_label] if r.rc == 0)
                for label, code in codes:
                    ok = [r for r in runs[label] if r.rc == 0]
                    if not ok:
                        rows.append((trace.name, mode, label, None, None, None, None, None, None, None, None, "failed"))
                        continue
                    med = statistics.median(r.wall_s for r in ok)
                    cpu = statistics.median(r.cpu_s for r in ok)
                    same = digests[label] == digests[base_label] and len(digests[label]) == 1
                    rows.append((trace.name, mode, label, med, min(r.wall_s for r in ok), max(r.wall_s for r in ok),
                                 max(r.maxrss_bytes for r in ok), med / base_med, med / floor2 if floor2 else None,
                                 cpu, cpu / base_cpu,
                                 "same as baseline" if same else "DIFFERS"))
        load1 = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "stepscope"], capture_output=True,
                           text=True).stdout.strip()
    lines = [f"# Working tree against {base_label}", "",
             f"`python benchmarks/baseline.py {' '.join(argv if argv is not None else sys.argv[1:])}`".replace(" `", "`"),
             f"on {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, tree at {head}{' (modified)' if dirty else ''}, "
             f"{args.reps} interleaved rounds, load average {load0:.2f} at the start and {load1:.2f} at the end.",
             f"The compiled reader: {'; '.join(natives)}.",
             "", "| trace | mode | code | median wall | min–max | ÷ baseline | × floor2 | median CPU | ÷ baseline | peak RSS | JSON |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for trace, mode, label, med, lo, hi, rss, ratio, xf, cpu, cpu_ratio, same in rows:
        if med is None:
            lines.append(f"| {trace} | {mode} | {label} | — | — | — | — | — | — | — | {same} |")
            continue
        lines.append(f"| {trace} | {mode} | {label} | {med:.2f} s | {lo:.2f}–{hi:.2f} s | {ratio:.2f} | "
                     f"{'—' if xf is None else f'{xf:.1f}×'} | {cpu:.2f} s | {cpu_ratio:.2f} | {rss / 2**20:,.0f} MiB | "
                     f"{same} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        Path(args.results).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
