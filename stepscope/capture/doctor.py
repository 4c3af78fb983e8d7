"""`stepscope doctor`: what this machine can capture, and what to fix when it cannot."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from stepscope.capture import nsys as nsys_mod

NCU_GLOBS = ("opt/nvidia/nsight-compute/*/ncu", "usr/local/cuda*/bin/ncu")


def _run(cmd: list[str], timeout: float = 30) -> tuple[int, str]:
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return -1, str(e)
    return cp.returncode, (cp.stdout + cp.stderr).strip()


def check_nsys(env: dict[str, str] | None = None, root: str = "/",
               cache_dir: Path | None = None) -> dict[str, Any]:
    found = nsys_mod.discover(env, root, cache_dir)
    if found is None:
        return {"ok": False, "path": None,
                "problem": "nsys not found (PATH, $NSYS, /opt/nvidia/nsight-systems, "
                           "/usr/local/cuda*/bin, Nsight Compute's bundled copy)",
                "fix": "install Nsight Systems, or set NSYS=/path/to/nsys"}
    version, raw = nsys_mod.nsys_version(found.path)
    imp = nsys_mod.check_importer(found.importer)
    info: dict[str, Any] = {
        "ok": bool(version) and imp.ok,
        "path": str(found.path),
        "source": found.source,
        "found_at": str(found.original) if found.original else str(found.path),
        "version": version,
        "importer": str(found.importer) if found.importer else None,
        "importer_runs": imp.ok,
        "notes": found.notes,
    }
    if not version:
        lib = nsys_mod.missing_library(raw)
        info["problem"] = (f"nsys does not run: cannot load {lib}" if lib
                           else f"nsys --version failed: {raw.splitlines()[-1] if raw else '?'}")
        if lib:
            info["fix"] = nsys_mod.LIBDW_FIX if lib.startswith("libdw") else \
                f"install the package providing {lib}"
    elif not imp.ok:
        info["problem"] = imp.problem
        info["fix"] = imp.fix
    return info


def check_ncu(env: dict[str, str] | None = None, root: str = "/") -> dict[str, Any]:
    env = dict(os.environ if env is None else env)
    paths: list[str] = []
    if env.get("NCU"):
        paths.append(env["NCU"])
    w = shutil.which("ncu", path=env.get("PATH", ""))
    if w:
        paths.append(w)
    for g in NCU_GLOBS:
        paths += sorted(glob.glob(os.path.join(root, g)), key=nsys_mod._version_key, reverse=True)
    for p in paths:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            rc, out = _run([p, "--version"])
            m = re.search(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)", out)
            return {"ok": rc == 0, "path": p, "version": m.group(1) if m else None}
    return {"ok": False, "path": None, "version": None,
            "problem": "ncu (Nsight Compute) not found", "fix": "install Nsight Compute or set NCU"}


def check_gpus() -> dict[str, Any]:
    rc, out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                    "--format=csv,noheader"])
    gpus = []
    if rc == 0:
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 4 and parts[0].isdigit():
                gpus.append({"index": int(parts[0]), "name": parts[1], "memory": parts[2],
                             "driver": parts[3]})
    return {"ok": bool(gpus), "count": len(gpus), "gpus": gpus,
            "nvidia_smi": rc == 0}


def check_torch() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"ok": False, "installed": False, "problem": "torch not installed",
                "fix": "pip install torch (a CUDA build) for the torch engine"}
    try:
        import torch

        cuda = torch.cuda.is_available()
        return {"ok": cuda, "installed": True, "version": torch.__version__,
                "cuda_build": torch.version.cuda, "cuda_available": cuda,
                "device_count": torch.cuda.device_count() if cuda else 0,
                "devices": [torch.cuda.get_device_name(i)
                            for i in range(torch.cuda.device_count())] if cuda else []}
    except Exception as e:  # a broken install
        return {"ok": False, "installed": True, "problem": f"import torch failed: {e}"}


def _pkg(name: str) -> dict[str, Any]:
    if importlib.util.find_spec(name) is None:
        return {"installed": False, "version": None}
    try:
        return {"installed": True, "version": importlib.metadata.version(name)}
    except importlib.metadata.PackageNotFoundError:
        return {"installed": True, "version": None}


_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(?:;(.*))?$")


def parse_requirement(req: str) -> tuple[str, str, bool] | None:
    """'torch==2.11.0' -> ('torch', '==2.11.0', True); the bool says whether the requirement
    applies unconditionally (no `extra == ...` marker; other markers are taken as met)."""
    m = _REQ.match(req)
    if not m:
        return None
    name, spec, marker = m.group(1), (m.group(2) or "").strip().strip("()").strip(), m.group(3)
    return name, spec, not (marker and "extra" in marker)


def _satisfied(version: str | None, spec: str) -> bool | None:
    if not spec:
        return True
    if version is None:
        return None
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version.split("+")[0]) in SpecifierSet(spec)
    except Exception:  # no packaging, or an odd version string: cannot tell
        return None


def check_vllm() -> dict[str, Any]:
    """vLLM's version, whether the torch it pins is the one installed, which of its required
    packages are missing, and what stepscope's vLLM engine will set for it."""
    info: dict[str, Any] = _pkg("vllm")
    if not info["installed"]:
        info["problem"] = "not installed (pip install vllm; --engine torch works without it)"
        return info
    missing, wrong = [], []
    try:
        reqs = importlib.metadata.requires("vllm") or []
    except importlib.metadata.PackageNotFoundError:
        reqs = []
    for r in reqs:
        parsed = parse_requirement(r)
        if parsed is None or not parsed[2]:
            continue
        name, spec, _ = parsed
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if name.lower() in ("torch", "torchvision", "torchaudio", "triton"):
            if spec:
                info[f"{name.lower()}_required"] = spec
            if _satisfied(have, spec) is False:
                wrong.append(f"{name} {have} (vLLM {info['version']} needs {name}{spec})")
    info["missing"] = missing
    info["mismatched"] = wrong
    info["flashinfer"] = importlib.util.find_spec("flashinfer") is not None
    info["nvtx"] = importlib.util.find_spec("nvtx") is not None
    notes = []
    if not info["flashinfer"]:
        notes.append("flashinfer absent: the engine sets VLLM_USE_FLASHINFER_SAMPLER=0 "
                     "(greedy sampling needs none of it)")
    if not info["nvtx"]:
        notes.append("the nvtx package is absent: vLLM's own NVTX ranges (schedule, "
                     "get_output) will be missing from traces (pip install nvtx)")
    info["notes"] = notes
    problems = []
    if wrong:
        problems.append("; ".join(wrong))
    if missing:
        problems.append(f"missing packages vLLM requires: {', '.join(sorted(missing)[:12])}"
                        + (" …" if len(missing) > 12 else ""))
    if problems:
        info["problem"] = "; ".join(problems)
    return info


def diagnose() -> dict[str, Any]:
    nsys = check_nsys()
    gpus = check_gpus()
    torch_ = check_torch()
    vllm = check_vllm()
    triton = _pkg("triton")
    n_gpus = max(gpus["count"], torch_.get("device_count", 0))
    problems = []
    if n_gpus == 0:
        problems.append("capture needs an NVIDIA GPU and this machine has none visible "
                        "(nvidia-smi and torch see no device)")
    if not nsys["ok"]:
        problems.append(nsys.get("problem", "nsys unusable")
                        + (f"; fix: {nsys['fix']}" if nsys.get("fix") else ""))
    engines = []
    if vllm["installed"] and not vllm.get("mismatched"):
        engines.append("vllm")
    if vllm["installed"] and vllm.get("problem"):
        problems.append(f"vLLM {vllm['version']}: {vllm['problem']}")
    if torch_.get("cuda_available"):
        engines.append("torch")
    elif n_gpus:
        problems.append("torch cannot use the GPU (not installed or a CPU build): the torch "
                        "engine needs a CUDA build of torch")
    can = n_gpus > 0 and nsys["ok"] and bool(engines)
    verdict = (f"ready: stepscope trace can capture on {n_gpus} GPU(s) with "
               f"{' or '.join(engines)}") if can else "cannot capture here: " + "; ".join(
        problems or ["no engine (install vLLM or a CUDA build of torch)"])
    return {"can_capture": can, "verdict": verdict, "problems": problems, "nsys": nsys,
            "ncu": check_ncu(), "gpus": gpus, "torch": torch_, "triton": triton,
            "vllm": vllm, "engines": engines}


def render(d: dict[str, Any], console) -> None:
    from rich.table import Table

    def mark(ok: bool | None) -> str:
        return "[green]ok[/]" if ok else ("[yellow]–[/]" if ok is None else "[red]no[/]")

    t = Table(title="stepscope doctor", show_lines=False)
    t.add_column("component")
    t.add_column("", justify="center")
    t.add_column("details", overflow="fold")
    n = d["nsys"]
    if n.get("path"):
        detail = f"{n['path']} (version {n.get('version') or '?'}, via {n.get('source')})"
        if n.get("found_at") and n["found_at"] != n["path"]:
            detail += f"; found at {n['found_at']}"
    else:
        detail = n.get("problem", "")
    t.add_row("nsys", mark(n["ok"]), detail)
    if n.get("path"):
        imp = n.get("importer") or "not found"
        line = f"{imp}: {'runs' if n.get('importer_runs') else 'does not run'}"
        if n.get("problem"):
            line += f" — {n['problem']}"
        if n.get("fix"):
            line += f"; fix: {n['fix']}"
        t.add_row("nsys importer", mark(n.get("importer_runs")), line)
    c = d["ncu"]
    t.add_row("ncu", mark(c["ok"]), f"{c['path']} (version {c.get('version') or '?'})"
              if c["path"] else c.get("problem", ""))
    g = d["gpus"]
    t.add_row("GPUs", mark(g["ok"]), ", ".join(f"{x['index']}: {x['name']} ({x['memory']})"
                                                for x in g["gpus"]) or "none visible")
    tt = d["torch"]
    if tt.get("installed") and "version" in tt:
        det = (f"torch {tt['version']}, CUDA build {tt.get('cuda_build') or 'none (CPU build)'}"
               f", CUDA available: {'yes' if tt.get('cuda_available') else 'no'}")
    else:
        det = tt.get("problem", "")
    t.add_row("torch", mark(tt["ok"]), det)
    tr = d["triton"]
    t.add_row("triton", mark(tr["installed"] or None),
              f"triton {tr['version']}" if tr["installed"] else
              "not installed (torch engine uses plain torch ops)")
    v = d["vllm"]
    if v["installed"]:
        det = f"vllm {v['version']}"
        if v.get("torch_required"):
            det += f" (pins torch{v['torch_required']})"
        for extra in ([v["problem"]] if v.get("problem") else []) + v.get("notes", []):
            det += f"; {extra}"
    else:
        det = "not installed (--engine torch works without it)"
    t.add_row("vLLM", mark((not v.get("problem")) if v["installed"] else None), det)
    console.print(t)
    style = "green" if d["can_capture"] else "red"
    console.print(f"[{style}]{d['verdict']}[/]")
