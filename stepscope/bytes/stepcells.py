"""Cells from the real step: every kernel of one engine step measured under ncu, in launch order.

The sentinel sweep (sweep.py) measures the torch engine's ops at many shapes; a real vLLM step
launches other kernels (FA3's `device_kernel`, `prepare_varlen_num_blocks_kernel`, vLLM's own
Triton input preparation, a differently dispatched LM head). This runs the engine itself, the
same step `stepscope trace` captures (same arguments, its own cudaProfilerStart/Stop range
around exactly that step), under

    ncu --target-processes T --profile-from-start off --clock-control none
        --cache-control none --replay-mode R --metrics <the sweep's> --csv --page raw
        --print-units base  python -m stepscope.capture.engines.<engine> ...

and keeps one cells row per profiled launch, numbered in launch order (`launch`), so that
`stepscope budget` can join the n-th kernel of the nsys step to the n-th profiled kernel
(budget.py, the `order` join), checked by name.

Why these settings: `--clock-control none` leaves the GPU's clocks as the engine runs them
(ncu would lock them to base); `--cache-control none` does not flush L2 before each kernel,
so a kernel finds what the one before it left in L2, as it does in the real step (activations
written by a norm are read from L2 by the next GEMM; a cold L2 would charge them to DRAM
again). vLLM runs in one process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, async scheduling off):
the engine core, whose worker opens the profiler range, is then the process ncu follows.

Replay (ENGINE_NCU): ncu takes 3 passes per kernel for these metrics on the H200 (its own
`profiler__replayer_passes` column). Under kernel replay it backs up the memory a kernel can
reach before the first pass and restores it for the others (49.5 GB per kernel of the torch
step, `profiler__replayer_bytes_mem_backed_up`), and with --csv it prints nothing until the
end: the torch engine's 388 kernels took 103 s so, silent. vLLM's step under kernel replay gave
no result: the fifth round's runs were killed 220 s and 365 s after the start (the in-process
one 340 s after vLLM started its profiler, where the torch step's whole run takes 103 s); this
round's four (async scheduling on or off, V1 or V2 model runner, a 4 GiB KV cache, only the
application targeted; fixtures/ncu/step_vllm_hung/) were stopped by the stall watch after
60-75 quiet seconds, too soon to tell slow from stuck, with the engine's thread busy (100 %
CPU) inside ncu's interception of cudaLaunchKernel. Under application replay (ncu runs the
engine once per pass, backs up nothing, and says so between runs) the 436 kernels of the same
step took 132 s: that is vLLM's default. The stall watch (stall_s: on by default under
application replay only, where silence is not normal) ends a run with the state of its
processes and their native and Python stacks in the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.bytes import ncu as ncu_csv
from stepscope.errors import EnvironmentProblem, InputError

SWEEP_PREFIX = "step:"  # the `sweep` of step cells: step:<engine>:<model>:<phase>:b<batch>:<mode>
ENGINES = ("vllm", "torch")


@dataclass
class StepCellsRun:
    rows: list[dict]
    command: list[str]
    raw_path: Path
    log_path: Path
    seconds: float
    returncode: int | None
    ncu_version: str
    passes: dict[int, int] = field(default_factory=dict)  # passes -> kernels that took them
    gpu: str | None = None


def sweep_name(engine: str, model: str, phase: str, batch: int, mode: str) -> str:
    return f"{SWEEP_PREFIX}{engine}:{model}:{phase}:b{batch}:{mode}"


def is_step_cells(cells) -> bool:
    """Whether a cells table holds one step's launches in order (made by this module)."""
    if "sweep" not in cells.columns or cells.height == 0:
        return False
    sweeps = cells["sweep"].drop_nulls().unique().to_list()
    return len(sweeps) == 1 and str(sweeps[0]).startswith(SWEEP_PREFIX)


def group_pids(pgid: int) -> list[int]:
    """The processes of a process group (ncu and the engine it runs)."""
    return [int(d.name) for d in Path("/proc").glob("[0-9]*") if _pgid(int(d.name)) == pgid]


def group_pythons(pgid: int) -> list[int]:
    """Python processes of a process group (the engine under ncu; not ncu itself)."""
    return [p for p in group_pids(pgid) if (info := _cpu_ticks(p)) and info[0].startswith("python")]


def _cpu_ticks(pid: int) -> tuple[str, str, int, int] | None:
    """(comm, state, utime+stime ticks, threads) of a process, None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    f = stat[stat.rfind(")") + 2:].split()
    return comm, f[0], int(f[11]) + int(f[12]), int(f[17])


def stall_report(pgid: int, sample_s: float = 2.0) -> str:
    """What a stalled run's processes are doing: each one's state and CPU use over sample_s
    (a busy ncu is working, an idle one waits), then the native stacks of every thread where
    eu-stack or gdb exists (ncu's injection and the CUDA driver show there, not in Python's)."""
    import shutil

    pids = group_pids(pgid)
    before = {p: _cpu_ticks(p) for p in pids}
    time.sleep(sample_s)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    lines = [f"# stall report: processes of group {pgid}, CPU over {sample_s:g} s"]
    for p in pids:
        a, b = before.get(p), _cpu_ticks(p)
        if a is None or b is None:
            continue
        pct = 100.0 * (b[2] - a[2]) / hz / sample_s
        lines.append(f"#   pid {p} {b[0]} state {b[1]} threads {b[3]} cpu {pct:.0f}%")
    tool = shutil.which("eu-stack") or shutil.which("gdb")
    for p in pids if tool else []:
        cmd = ([tool, "-p", str(p)] if tool.endswith("eu-stack")
               else [tool, "-batch", "-p", str(p), "-ex", "thread apply all bt"])
        try:
            cp = subprocess.run(cmd, capture_output=True, text=True, timeout=45)
            text = (cp.stdout + cp.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"{type(e).__name__}: {e}"
        lines.append(f"# native stacks of pid {p} ({' '.join(cmd)}):")
        lines.extend("#   " + ln for ln in text.splitlines()[:400])
    if not tool:
        lines.append("# (no eu-stack or gdb here: native stacks not taken)")
    return "\n".join(lines) + "\n"


def _pgid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rfind(")") + 2:].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def engine_command(engine: str, model: str, *, phase: str, batch: int, context: int,
                   mode: str, layers: int | None, python: str = sys.executable,
                   kv_cache_gib: float | None = None) -> list[str]:
    """The engine's own command line for the step (no untraced timing: only the step runs
    inside the profiler range, and ncu would slow the timing anyway)."""
    if engine == "vllm":
        from stepscope.capture.engines import vllm_engine

        # async scheduling off under ncu: one step at a time (the runs measured on the H200 had it
        # off; it did not cure kernel replay's stall, application replay did: module docstring)
        return vllm_engine.command(model, phase=phase, batch=batch, context=context, mode=mode,
                                   tp=1, layers=layers, python=python, untraced_steps=0,
                                   sync_scheduling=True, kv_cache_gib=kv_cache_gib)
    if engine == "torch":
        cmd = [python, "-m", "stepscope.capture.engines.torch_engine", "--model", model,
               "--phase", phase, "--batch", str(batch), "--context", str(context),
               "--mode", mode, "--tp", "1", "--warmup", "3", "--untraced-steps", "0"]
        return cmd + (["--layers", str(layers)] if layers else [])
    raise InputError(f"unknown engine {engine!r}: choose vllm or torch")


# ncu's replay mode and target processes per engine, as measured on the H200 (module docstring):
# vLLM's step only under application replay, the torch engine's under kernel replay too
ENGINE_NCU = {"vllm": ("application", "application-only"), "torch": ("kernel", "all")}
STALL_S = 180.0  # application replay: the longest quiet stretch seen was one engine run (~45 s)


def ncu_settings(engine: str, replay_mode: str | None = None,
                 target_processes: str | None = None) -> tuple[str, str]:
    """(replay mode, target processes): the ones given, else the engine's (ENGINE_NCU)."""
    default = ENGINE_NCU.get(engine, ENGINE_NCU["torch"])
    replay_mode, target_processes = replay_mode or default[0], target_processes or default[1]
    if replay_mode not in ("kernel", "application"):
        raise InputError(f"--replay-mode {replay_mode!r}: kernel or application")
    if target_processes not in ("all", "application-only"):
        raise InputError(f"--target-processes {target_processes!r}: all or application-only")
    return replay_mode, target_processes

# the GPU's name rides along as a device attribute (no extra pass)
STEP_METRICS = (*ncu_csv.DEFAULT_METRICS, "device__attribute_display_name")


def ncu_command(ncu: str, app: list[str], *, metrics: tuple[str, ...] = STEP_METRICS,
                clock_control: str = "none", cache_control: str = "none",
                replay_mode: str = "kernel", target_processes: str = "all") -> list[str]:
    return [ncu, "--target-processes", target_processes, "--profile-from-start", "off",
            "--clock-control", clock_control, "--cache-control", cache_control,
            "--replay-mode", replay_mode, "--metrics", ",".join(metrics),
            "--csv", "--page", "raw", "--print-units", "base", *app]


def engine_env(engine: str) -> dict[str, str]:
    from stepscope.capture.run import engine_env as capture_env

    env = capture_env(engine)
    if engine == "vllm":
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("CUBLASLT_LOG_LEVEL", "0")
    env.setdefault("PYTHONFAULTHANDLER", "1")  # the stall watch asks for stacks with SIGABRT
    return env


def step_rows(launches: list[dict], *, engine: str, model: str, phase: str, batch: int,
              context: int, mode: str, gpu: str | None, ncu_version: str,
              cache_control: str, clock_control: str) -> list[dict]:
    """Cells rows of one profiled step: launches in launch order (ncu's ID, per process)."""
    ordered = sorted(launches, key=lambda d: (d.get("pid") or 0, d.get("id") or 0))
    tokens = batch if phase == "decode" else batch * context
    rows = []
    for i, d in enumerate(ordered):
        r = ncu_csv.launch_record(d)
        name = r.pop("device__attribute_display_name", None)
        r.update({
            "gpu": gpu or (name if isinstance(name, str) else None), "model": model,
            "sweep": sweep_name(engine, model, phase, batch, mode), "cell": f"step#{i}",
            "op": None, "proj": None, "tokens": tokens, "batch": batch, "context": context,
            "launch": i, "matched": True, "cell_min_bytes": None, "error": None,
            "clock_control": clock_control, "ncu_version": ncu_version, "source": "step",
            "engine": engine, "phase": phase, "mode": mode, "cache_control": cache_control,
        })
        rows.append(r)
    return rows


def run_step_cells(engine: str, model: str, *, phase: str, batch: int, context: int,
                   mode: str, layers: int | None, out: Path, ncu: str | None = None,
                   timeout_s: float = 540.0, cache_control: str = "none",
                   clock_control: str = "none", on_progress=None,
                   stall_s: float | None = None, kv_cache_gib: float | None = None,
                   replay_mode: str | None = None, target_processes: str | None = None
                   ) -> StepCellsRun:
    """Profile one engine step under ncu; write OUT/ncu_raw.csv and OUT/ncu.log.

    stall_s: a run that prints nothing for this long (no ncu line, no engine line) is stopped,
    after its Python processes were asked for their stacks (faulthandler, into the log), so a
    hang says where it hangs instead of only that it did. None: STALL_S under application
    replay, no stall watch under kernel replay (ncu is silent while it profiles)."""
    from stepscope.bytes.sweep import find_ncu, ncu_version

    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}: choose vllm or torch")
    if engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise EnvironmentProblem("--engine vllm needs vLLM, which is not installed here "
                                     "(pip install vllm), or use --engine torch")
    if mode not in ("eager", "graph"):
        raise InputError(f"--mode {mode!r}: step cells are measured in eager or graph mode")
    replay_mode, target_processes = ncu_settings(engine, replay_mode, target_processes)
    if stall_s is None and replay_mode == "application":
        stall_s = STALL_S
    ncu_path = find_ncu(ncu)
    ver = ncu_version(ncu_path)
    out.mkdir(parents=True, exist_ok=True)
    raw_path, log_path = out / "ncu_raw.csv", out / "ncu.log"
    app = engine_command(engine, model, phase=phase, batch=batch, context=context, mode=mode,
                         layers=layers, kv_cache_gib=kv_cache_gib)
    cmd = ncu_command(ncu_path, app, cache_control=cache_control, clock_control=clock_control,
                      replay_mode=replay_mode, target_processes=target_processes)
    t0 = time.perf_counter()
    profiled = runs = 0
    rc = None
    with open(raw_path, "w") as raw, open(log_path, "w") as log:
        log.write("# " + " ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=engine_env(engine), text=True,
                                    errors="replace", start_new_session=True)
        except OSError as e:
            raise EnvironmentProblem(f"cannot start {cmd[0]}: {e}") from None
        assert proc.stdout is not None
        import signal
        import threading

        ended = threading.Event()
        stalled: list[str] = []
        last = [time.monotonic(), ""]

        def stop() -> None:  # a hung engine must not hold the device call
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        def watch_stall() -> None:
            while not ended.wait(1.0):
                quiet = time.monotonic() - last[0]
                if stall_s is not None and quiet >= stall_s:
                    stalled.append(last[1])
                    try:
                        log.write(stall_report(proc.pid))
                        log.flush()
                    except Exception as e:  # the report helps; stopping the run matters
                        log.write(f"# stall report failed: {type(e).__name__}: {e}\n")
                    # SIGABRT: faulthandler prints every thread's stack, then the process dies
                    for pid in group_pythons(proc.pid):
                        try:
                            os.kill(pid, signal.SIGABRT)
                        except (ProcessLookupError, PermissionError):
                            pass
                    ended.wait(5.0)
                    stop()
                    return

        watchdog = threading.Timer(timeout_s, stop)
        watchdog.start()
        threading.Thread(target=watch_stall, daemon=True).start()
        for line in proc.stdout:  # ncu's log lines, the engine's output, then the CSV
            last[0], last[1] = time.monotonic(), line
            raw.write(line)
            if line.startswith("==PROF== Profiling"):
                profiled += 1
                if on_progress:
                    on_progress(profiled, time.perf_counter() - t0, "kernels profiled")
            elif line.startswith("==PROF== Connected to process"):
                runs += 1  # application replay: one run of the engine per pass
                if on_progress and replay_mode == "application":
                    on_progress(runs, time.perf_counter() - t0,
                                "engine run(s) of application replay")
            elif not line.startswith('"'):
                log.write(line)
        rc = proc.wait()
        ended.set()
        watchdog.cancel()
    seconds = time.perf_counter() - t0
    if stalled:
        what = " ".join(stalled[0].split())[:200]
        raise EnvironmentProblem(
            f"the step stalled under ncu: {profiled} kernel(s) profiled, then no output for "
            f"{stall_s:.0f} s after {what!r}; the engine's Python stacks are in {log_path}")
    text = raw_path.read_text(errors="replace")
    if "ERR_NVGPUCTRPERM" in text:
        raise EnvironmentProblem(ncu_csv.PERM_HELP)
    parsed = ncu_csv.parse_text(text, str(raw_path))
    if not parsed.launches:
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        why = next((ln for ln in reversed(tail) if "error" in ln.lower()), tail[-1] if tail else "")
        raise EnvironmentProblem(f"ncu profiled no kernel of the step (exit {rc}"
                                 + (f": {why.strip()[:300]}" if why else "") + f"); log: {log_path}")
    ncu_csv.check_metrics(parsed)
    gpu = None
    rows = step_rows(parsed.launches, engine=engine, model=model, phase=phase, batch=batch,
                     context=context, mode=mode, gpu=gpu, ncu_version=ver,
                     cache_control=cache_control, clock_control=clock_control)
    gpu = next((r["gpu"] for r in rows if r.get("gpu")), None)
    # ncu's own count of the passes of each kernel (no per-kernel log line with --csv)
    passes: dict[int, int] = {}
    counted = [r.get("profiler__replayer_passes") for r in rows]
    if counted and all(isinstance(v, (int, float)) for v in counted):
        for v in counted:
            passes[int(v)] = passes.get(int(v), 0) + 1
    meta = {"command": cmd, "seconds": round(seconds, 1), "returncode": rc,
            "kernels": len(rows), "passes": {str(k): v for k, v in sorted(passes.items())},
            "ncu_version": ver, "gpu": gpu, "engine": engine, "model": model, "phase": phase,
            "batch": batch, "context": context, "mode": mode, "layers": layers,
            "cache_control": cache_control, "clock_control": clock_control,
            "kv_cache_gib": kv_cache_gib, "replay_mode": replay_mode,
            "application_runs": runs if replay_mode == "application" else None,
            "target_processes": target_processes,
            "env": {k: v for k, v in sorted(engine_env(engine).items())
                    if k.startswith(("VLLM_", "CUDA_", "NCCL_", "TORCH"))}}
    (out / "step_cells.json").write_text(json.dumps(meta, indent=1) + "\n")
    return StepCellsRun(rows, cmd, raw_path, log_path, seconds, rc, ver, passes, gpu)
