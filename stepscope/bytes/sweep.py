"""The sweep: a TOML definition of cells, and the runner that measures each under ncu.

Two ways to run (see `run_sweep`):

* **one cell per process** (`cells_per_process=1`), the seed's recipe exactly:
  `ncu --profile-from-start off -k regex:<op regex> --launch-count 2 --clock-control none
  --metrics ... --csv --page raw --print-units base python -m stepscope.bytes.sentinel --op ...`.
  Honest and simple, but every cell pays python + torch + CUDA start-up under ncu (several
  seconds), so 52 cells take minutes.
* **batched** (`cells_per_process=N>1`, or 0 for all): one sentinel process runs N cells,
  each inside its own cudaProfilerStart/Stop range opened by a marker launch
  (`torch.cuda._sleep` → kernel `spin_kernel`). ncu runs without `-k` and without
  `--launch-count`: the ranges alone bound what is profiled (the marker plus the op's
  kernels, after 10 un-profiled warm-ups). Launches are cut back into cells by order: ncu
  numbers profiled launches in launch order (`ID`), each marker starts the next cell of the
  manifest that opened a range. Each launch is then flagged `matched` by its op's regex, so
  a kernel the regex did not foresee is kept and shown, not lost. A cell that fails is
  recorded with its error (from the manifest) and the others go on; a process that dies or
  times out marks its unfinished cells as failed.

All ncu calls are argument lists (no shell). Per-chunk raw CSVs are kept and also
concatenated into one `ncu_raw.csv` (blocks separated by `==STEPSCOPE==` lines, which the
reader skips like ncu's own `==PROF==` lines).
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.bytes import ncu as ncu_csv
from stepscope.bytes.minbytes import op_min_bytes, shape_of
from stepscope.bytes.sentinel import MARKER_KERNEL, cell_id
from stepscope.errors import EnvironmentProblem, InputError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO_ROOT = Path(__file__).resolve().parents[2]
SWEEPS_DIR = REPO_ROOT / "recipes" / "sweeps"
NCU_FALLBACKS = (
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)


@dataclass
class Sweep:
    name: str
    model: str
    warmups: int = 10
    launch_count: int = 2
    clock_control: str = "none"
    metrics: list[str] = field(default_factory=lambda: list(ncu_csv.DEFAULT_METRICS))
    regex: dict[str, str] = field(default_factory=dict)
    cells: list[dict] = field(default_factory=list)
    smoke: list[str] = field(default_factory=list)
    path: str | None = None

    def select(self, names: list[str] | None) -> list[dict]:
        if not names:
            return list(self.cells)
        by = {c["cell"]: c for c in self.cells}
        missing = [n for n in names if n not in by]
        if missing:
            raise InputError(f"no cell {', '.join(missing)} in sweep {self.name!r}; "
                             f"cells are named like {', '.join(list(by)[:4])}, ...")
        return [by[n] for n in names]


def default_sweep_path() -> Path:
    return SWEEPS_DIR / "llama_default.toml"


def _expand(entry: dict) -> list[dict]:
    keys = list(entry)
    lists = [entry[k] if isinstance(entry[k], list) else [entry[k]] for k in keys]
    out = []
    for combo in itertools.product(*lists):
        spec = {"op": None, "proj": None, "m": None, "batch": None, "context": None}
        spec.update(dict(zip(keys, combo)))
        if spec["m"] is None:
            spec["m"] = spec["batch"] or 1
        spec["cell"] = cell_id(spec)
        out.append(spec)
    return out


def load_sweep(path: str | Path | None = None) -> Sweep:
    p = Path(path) if path else default_sweep_path()
    if not p.exists():
        hint = ("; the default sweep lives in a stepscope checkout's recipes/sweeps/: install with "
                "pip install -e, or pass --sweep FILE") if not path else ""
        raise InputError(f"sweep file {p} does not exist{hint}")
    try:
        d = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"sweep file {p} is not valid TOML: {e}") from None
    from stepscope.bytes.sentinel import OPS, PROJS

    cells: list[dict] = []
    for entry in d.get("cells", []):
        for spec in _expand(entry):
            if spec["op"] not in OPS:
                raise InputError(f"{p}: unknown op {spec['op']!r} (ops: {', '.join(OPS)})")
            if spec["op"] == "gemm" and spec["proj"] not in PROJS:
                raise InputError(f"{p}: gemm cell needs proj in {', '.join(PROJS)}")
            cells.append(spec)
    if not cells:
        raise InputError(f"{p}: no [[cells]] defined")
    names = [c["cell"] for c in cells]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"{p}: duplicate cells {', '.join(dup)}")
    regex = {str(k): str(v) for k, v in d.get("regex", {}).items()}
    for op in {c["op"] for c in cells}:
        if op not in regex:
            raise InputError(f"{p}: no [regex] entry for op {op!r}")
        try:
            re.compile(regex[op])
        except re.error as e:
            raise InputError(f"{p}: bad regex for {op}: {e}") from None
    metrics = list(d.get("metrics", ncu_csv.DEFAULT_METRICS))
    for m in ncu_csv.REQUIRED_METRICS:
        if m not in metrics:
            raise InputError(f"{p}: metrics must include {m}")
    sw = Sweep(
        name=str(d.get("name", p.stem)), model=str(d.get("model", "llama-3.1-8b")),
        warmups=int(d.get("warmups", 10)), launch_count=int(d.get("launch_count", 2)),
        clock_control=str(d.get("clock_control", "none")), metrics=metrics, regex=regex,
        cells=cells, smoke=list(d.get("smoke", {}).get("cells", [])), path=str(p),
    )
    sw.select(sw.smoke)  # validates smoke names
    return sw


# --- ncu ---------------------------------------------------------------------------------

def find_ncu(explicit: str | None = None) -> str:
    """The ncu executable: --ncu, $STEPSCOPE_NCU, PATH, then the usual install folders."""
    for cand in (explicit, os.environ.get("STEPSCOPE_NCU")):
        if cand:
            if Path(cand).is_file() and os.access(cand, os.X_OK):
                return cand
            found = shutil.which(cand)
            if found:
                return found
            raise EnvironmentProblem(f"ncu not found at {cand}")
    found = shutil.which("ncu")
    if found:
        return found
    for pat in NCU_FALLBACKS:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    raise EnvironmentProblem(
        "ncu (Nsight Compute CLI) not found: put it on PATH, pass --ncu PATH, or set "
        "STEPSCOPE_NCU (it ships with the CUDA toolkit and in /opt/nvidia/nsight-compute/)")


def ncu_version(ncu: str) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
        lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        return lines[-1] if lines else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def ncu_common(sweep: Sweep) -> list[str]:
    return [
        "--profile-from-start", "off",
        "--clock-control", sweep.clock_control,
        "--metrics", ",".join(sweep.metrics),
        "--csv", "--page", "raw", "--print-units", "base",
    ]


def sentinel_args(python: str, model: str, warmups: int) -> list[str]:
    return [python, "-m", "stepscope.bytes.sentinel", "--model", model,
            "--warmups", str(warmups)]


def cell_command(ncu: str, sweep: Sweep, spec: dict, model: str | None = None,
                 python: str | None = None, manifest: str | None = None) -> list[str]:
    """One cell, one process: the seed's command line."""
    cmd = [ncu, *ncu_common(sweep)[:4],
           "-k", f"regex:{sweep.regex[spec['op']]}",
           "--launch-count", str(sweep.launch_count),
           *ncu_common(sweep)[4:],
           *sentinel_args(python or sys.executable, model or sweep.model, sweep.warmups),
           "--op", spec["op"], "--m", str(spec["m"])]
    if spec.get("proj"):
        cmd += ["--proj", spec["proj"]]
    if spec.get("batch"):
        cmd += ["--batch", str(spec["batch"])]
    if spec.get("context"):
        cmd += ["--ctx", str(spec["context"])]
    if manifest:
        cmd += ["--manifest", manifest]
    return cmd


def batch_command(ncu: str, sweep: Sweep, cells_file: str, manifest: str,
                  model: str | None = None, python: str | None = None) -> list[str]:
    """Several cells, one process, one profiler range (with marker) per cell."""
    return [ncu, *ncu_common(sweep),
            *sentinel_args(python or sys.executable, model or sweep.model, sweep.warmups),
            "--cells", cells_file, "--marker", "--manifest", manifest]


# --- mapping launches back to cells -------------------------------------------------------

def assign_launches(launches: list[dict], specs: list[dict], manifest: list[dict],
                    batched: bool) -> dict[str, list[dict]]:
    """cell name -> its launches (in ID order). Batched: cut at marker launches."""
    out: dict[str, list[dict]] = {s["cell"]: [] for s in specs}
    ordered = sorted(launches, key=lambda d: (d.get("pid") or 0, d.get("id") or 0))
    if not batched:
        if len(specs) == 1:
            out[specs[0]["cell"]] = ordered
        return out
    opened = [r["cell"] for r in manifest if r.get("marker")]
    idx = -1
    for d in ordered:
        name = d.get("kernel") or ""
        if re.search(MARKER_KERNEL, name):
            idx += 1
            continue
        if 0 <= idx < len(opened):
            out[opened[idx]].append(d)
    return out


def min_bytes_of(spec: dict, shape) -> int | None:
    try:
        return op_min_bytes(shape, spec["op"], int(spec["m"] or 1), proj=spec.get("proj"),
                            batch=spec.get("batch"), context=spec.get("context"))["min_bytes"]
    except Exception:
        return None


def cell_rows(spec: dict, launches: list[dict], *, sweep: Sweep, model: str, gpu: str | None,
              error: str | None, ncu_ver: str, shape) -> list[dict]:
    """Cells-table rows of one cell: one per profiled launch, or one error row."""
    base = {
        "gpu": gpu, "model": model, "sweep": sweep.name, "cell": spec["cell"], "op": spec["op"],
        "proj": spec.get("proj"), "tokens": int(spec["m"] or 1), "batch": spec.get("batch"),
        "context": spec.get("context"), "cell_min_bytes": min_bytes_of(spec, shape),
        "clock_control": sweep.clock_control, "ncu_version": ncu_ver,
    }
    rx = re.compile(sweep.regex.get(spec["op"], "."))
    rows = []
    for i, d in enumerate(launches):
        r = {**base, **ncu_csv.launch_record(d), "launch": i,
             "matched": bool(rx.search(d.get("kernel") or "")), "error": None}
        rows.append(r)
    if not rows:
        rows.append({**base, "launch": None, "matched": False,
                     "error": error or "no kernel profiled in the cell's range"})
    elif error:
        for r in rows:
            r["error"] = error
    return rows


# --- the runner ---------------------------------------------------------------------------

@dataclass
class SweepResult:
    rows: list[dict]
    gpu: str | None
    ncu_version: str
    raw_files: list[str]
    failed: list[str]
    seconds: float


def _chunks(specs: list[dict], n: int) -> list[list[dict]]:
    if n <= 0 or n >= len(specs):
        return [specs]
    return [specs[i:i + n] for i in range(0, len(specs), n)]


def _read_manifest(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for ln in path.read_text().splitlines():
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            pass
    return out


def run_sweep(sweep: Sweep, out_dir: str | Path, *, model: str | None = None,
              cells: list[str] | None = None, cells_per_process: int = 0,
              ncu: str | None = None, timeout_s: float = 300.0, python: str | None = None,
              progress: bool = True, log=None, deadline_s: float | None = None) -> SweepResult:
    """Measure every selected cell under ncu; survive failing cells and processes.

    `timeout_s` bounds one sentinel process; `deadline_s` bounds the whole sweep: a process
    gets at most the time left, and cells not started by then are recorded as skipped.
    """
    t_start = time.perf_counter()
    model = model or sweep.model
    shape = shape_of(_card_for(model))
    ncu_path = find_ncu(ncu)
    ver = ncu_version(ncu_path)
    specs = sweep.select(cells)
    out = Path(out_dir)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    batched = cells_per_process != 1
    chunks = _chunks(specs, cells_per_process) if batched else [[s] for s in specs]
    from stepscope import native

    env = native.child_env()  # the workload runs without stepscope's allocator/BLAS settings
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("CUBLASLT_LOG_LEVEL", "0")

    def say(msg: str) -> None:
        if log is not None:
            log.write(msg + "\n")
            log.flush()

    say(f"sweep {sweep.name} model {model} cells {len(specs)} processes {len(chunks)} "
        f"ncu {ncu_path} ({ver})")
    rows: list[dict] = []
    raw_files: list[str] = []
    failed: list[str] = []
    gpu: str | None = None

    prog = None
    if progress:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        prog = Progress(TextColumn("[bold]cells[/]"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.description}"),
                        console=_stderr_console())
        prog.start()
        task = prog.add_task("", total=len(specs))
    done_before = 0
    try:
        for ci, chunk in enumerate(chunks):
            tag = f"chunk{ci:02d}"
            left = None if deadline_s is None else deadline_s - (time.perf_counter() - t_start)
            if left is not None and left < 10:
                for spec in chunk:
                    rows.extend(cell_rows(spec, [], sweep=sweep, model=model, gpu=gpu,
                                          error="skipped: sweep deadline reached",
                                          ncu_ver=ver, shape=shape))
                    failed.append(spec["cell"])
                say(f"[{tag}] skipped {len(chunk)} cell(s): deadline reached")
                done_before += len(chunk)
                continue
            limit = timeout_s if left is None else min(timeout_s, left)
            man_path = work / f"{tag}.manifest.jsonl"
            raw_path = work / f"{tag}.ncu.csv"
            err_path = work / f"{tag}.stderr.txt"
            man_path.unlink(missing_ok=True)
            if batched:
                cells_file = work / f"{tag}.cells.json"
                cells_file.write_text(json.dumps(chunk, indent=1))
                cmd = batch_command(ncu_path, sweep, str(cells_file), str(man_path), model,
                                    python)
            else:
                cmd = cell_command(ncu_path, sweep, chunk[0], model, python, str(man_path))
            say(f"[{tag}] " + " ".join(cmd))
            if prog:
                prog.update(task, description=chunk[0]["cell"]
                            + (f" … {chunk[-1]['cell']}" if len(chunk) > 1 else ""))
            timed_out, rc = False, None
            with open(raw_path, "w") as fo, open(err_path, "w") as fe:
                proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, cwd=str(REPO_ROOT),
                                        start_new_session=True)
                t0 = time.perf_counter()
                while True:
                    try:
                        rc = proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        if prog:
                            prog.update(task, completed=done_before
                                        + len(_read_manifest(man_path)))
                        if time.perf_counter() - t0 > limit:
                            timed_out = True
                            _kill(proc)
                            rc = proc.wait()
                            break
            raw_files.append(str(raw_path))
            text = raw_path.read_text(errors="replace")
            stderr = err_path.read_text(errors="replace")
            if "ERR_NVGPUCTRPERM" in text + stderr:
                raise EnvironmentProblem(ncu_csv.PERM_HELP)
            manifest = _read_manifest(man_path)
            by_cell = {r["cell"]: r for r in manifest}
            gpu = gpu or next((r.get("gpu") for r in manifest if r.get("gpu")), None)
            try:
                parsed = ncu_csv.parse_text(text, str(raw_path))
            except EnvironmentProblem:
                raise
            missing = parsed.missing() if parsed.launches else []
            assigned = assign_launches(parsed.launches, chunk, manifest, batched)
            chunk_err = None
            if timed_out:
                chunk_err = f"process timed out after {limit:.0f} s"
            elif rc not in (0, 1) and not manifest:
                tail = (stderr.strip().splitlines() or ["(no output)"])[-1][:300]
                chunk_err = f"process exited {rc}: {tail}"
            elif missing:
                chunk_err = f"ncu CSV lacks {', '.join(missing)}"
            for spec in chunk:
                rec = by_cell.get(spec["cell"]) or (manifest[0] if not batched and manifest
                                                    else None)
                err = (rec or {}).get("error") or chunk_err
                if rec is None and err is None:
                    err = f"cell did not run (process exited {rc})"
                launches = assigned.get(spec["cell"], []) if not missing else []
                if err is None and not launches:
                    err = "no kernel profiled in the cell's range"
                    if not batched:
                        err = f"no kernel matched regex:{sweep.regex[spec['op']]}"
                rs = cell_rows(spec, launches, sweep=sweep, model=model, gpu=gpu, error=err,
                               ncu_ver=ver, shape=shape)
                rows.extend(rs)
                if any(r["error"] for r in rs):
                    failed.append(spec["cell"])
                    say(f"[{tag}] FAILED {spec['cell']}: {rs[0]['error']}")
                else:
                    nbytes = sum((r.get("dram_read_bytes") or 0)
                                 + (r.get("dram_write_bytes") or 0) for r in rs)
                    say(f"[{tag}] ok {spec['cell']}: {len(rs)} launch(es), {nbytes} bytes")
            done_before += len(chunk)
            if prog:
                prog.update(task, completed=done_before)
    finally:
        if prog:
            prog.stop()
    for r in rows:
        r["gpu"] = r["gpu"] or gpu
    raw_all = out / "ncu_raw.csv"
    with open(raw_all, "w") as f:
        for p in raw_files:
            f.write(f"==STEPSCOPE== {Path(p).name}\n")
            f.write(Path(p).read_text(errors="replace"))
            f.write("\n")
    return SweepResult(rows=rows, gpu=gpu, ncu_version=ver, raw_files=[str(raw_all)],
                       failed=failed, seconds=time.perf_counter() - t_start)


def _card_for(model: str) -> Any:
    from stepscope.bytes.minbytes import load_card

    return load_card(model)


def _kill(proc: subprocess.Popen) -> None:
    """Stop the sentinel/ncu process group this runner started (and only that)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)
