"""`stepscope trace`: run one engine step under nsys, keep the files, analyze the export.

Phases shown while it runs: engine start, warm-up, capture, export, analysis. Every
subprocess is started with an argument list (never a shell). Files kept in `--out DIR`, per
capture `<base>.nsys-rep`, `<base>.sqlite` and `<base>.engine.log`, where base is
`<model>_<phase>_b<batch>_<mode>[_tp<N>]`.

The analysis is `stepscope analyze <sqlite> [--json]` in a subprocess (`CLI_SHIM`), so this
module depends only on the analyzer's command line, not on its internals.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.capture import nsys as nsys_mod
from stepscope.capture.engines import vllm_engine
from stepscope.capture.models import LLAMA_LIKE, Card, load_card
from stepscope.errors import EnvironmentProblem, InputError

ENGINES = ("vllm", "torch")
MODES = ("eager", "graph", "compiled", "both")
PHASES = ("decode", "prefill")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the folder holding stepscope/
ENGINE_TAG = "stepscope-engine:"
# `python -m stepscope.cli` would load cli.py twice (as __main__ and as stepscope.cli, where the
# commands register), so the analyzer is started through its entry point instead.
CLI_SHIM = "import sys; sys.argv[0] = 'stepscope'; from stepscope.cli import main; main()"


@dataclass
class TraceRequest:
    model: str
    engine: str | None = None  # None: vllm when importable, else torch
    mode: str = "eager"  # eager | graph | both
    phase: str = "decode"
    batch: int = 1
    context: int = 2048
    tp: int = 1
    layers: int | None = None
    out: Path = Path("stepscope-out")
    json: bool = False
    warmup: int = 3
    untraced_steps: int | None = None  # None: the engine's default (0: no untraced timing)
    # torch engine only: the shape of the trace a foreign capture would have
    steps: int = 1                # steps inside the capture range
    step_name: str | None = None  # NVTX name of each step (None: stepscope's full name)
    nvtx: bool = True             # False: no step range, only the capture range
    ops: str | None = None        # light ops: auto | torch | triton
    emit_nvtx: bool = False       # an aten:: NVTX range per op
    # vLLM engine only: Inductor's triton.descriptive_names in graph mode
    inductor_names: str | None = None
    sync_scheduling: bool = False        # async scheduling off (the ncu step's twin)
    kv_cache_gib: float | None = None    # KV cache size instead of 85 % of the GPU
    quantization: str | None = None      # vLLM's quantization method (fp8, ...)
    # a serving-like run (vLLM engine): this many requests of mixed lengths, the whole
    # generate inside the capture range, instead of one step
    requests: int | None = None
    prompt_lens: tuple[int, int] | None = None
    output_lens: tuple[int, int] | None = None
    seed: int = 0

    @property
    def serving(self) -> dict | None:
        if not self.requests:
            return None
        from stepscope.capture.engines import vllm_serving as vs

        return {"requests": self.requests,
                "prompt_lens": self.prompt_lens or vs.DEFAULT_PROMPT_LENS,
                "output_lens": self.output_lens or vs.DEFAULT_OUTPUT_LENS,
                "seed": self.seed}

    @property
    def modes(self) -> list[str]:
        return ["eager", "graph"] if self.mode == "both" else [self.mode]


@dataclass
class Capture:
    mode: str
    base: Path
    command: list[str]
    wall_s: float = 0.0
    returncode: int | None = None
    engine_result: dict | None = None
    analysis: dict | str | None = None
    analysis_rc: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def sqlite(self) -> Path:
        return self.base.with_name(self.base.name + ".sqlite")

    @property
    def sidecar(self) -> Path:
        from stepscope.ingest.sidecar import sidecar_path

        return sidecar_path(self.sqlite)

    @property
    def nsys_rep(self) -> Path:
        return self.base.with_name(self.base.name + ".nsys-rep")

    @property
    def log(self) -> Path:
        return self.base.with_name(self.base.name + ".engine.log")

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "sqlite": str(self.sqlite),
            "nsys_rep": str(self.nsys_rep),
            "engine_log": str(self.log),
            "sidecar": str(self.sidecar) if self.sidecar.exists() else None,
            "command": self.command,
            "wall_s": round(self.wall_s, 3),
            "engine": self.engine_result,
            "analysis": self.analysis,
        }


# --- pure builders (tested without a GPU) ---------------------------------------------------
def trace_request(*, as_json: bool = False, no_nvtx: bool = False, requests: int | None = None,
                  prompt_lens: str | None = None, output_lens: str | None = None, **fields) -> TraceRequest:
    """The TraceRequest of `stepscope trace`'s options (`--json`, `--no-nvtx`, the serving
    ranges as typed), its sizes checked before nsys starts: run_trace checks the lower bounds,
    but a batch of 10^12 would fail much later."""
    from stepscope import options as opt

    opt.at_most(fields.get("batch", 1), "--batch", opt.MAX_BATCH)
    opt.at_most(fields.get("context", 1), "--context", opt.MAX_CONTEXT)
    opt.at_most(fields.get("tp", 1), "--tp", 1024)
    opt.at_most(fields.get("layers"), "--layers", 10_000)
    opt.number(fields.get("kv_cache_gib"), "--kv-cache-gib", 0.01, 4096)
    return TraceRequest(json=as_json, nvtx=not no_nvtx, **fields,
                        **serving_options(requests, prompt_lens, output_lens))


def serving_options(requests: int | None, prompt_lens: str | None, output_lens: str | None) -> dict:
    """--requests/--prompt-lens/--output-lens as TraceRequest fields (ranges checked here,
    before nsys starts)."""
    from stepscope import options as opt
    from stepscope.capture.engines.vllm_serving import parse_range

    if requests is None:
        if prompt_lens or output_lens:
            raise InputError("--prompt-lens and --output-lens need --requests")
        return {}
    opt.at_most(requests, "--requests", 100_000)
    out: dict = {"requests": requests}
    try:
        if prompt_lens:
            out["prompt_lens"] = parse_range(prompt_lens, "--prompt-lens")
        if output_lens:
            out["output_lens"] = parse_range(output_lens, "--output-lens")
    except ValueError as e:
        raise InputError(str(e)) from None
    return out


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def pick_engine(engine: str | None) -> str:
    if engine is None:
        return "vllm" if vllm_available() else "torch"
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}: choose vllm or torch")
    return engine


def slug(model: str) -> str:
    """`llama-3.1-8b` -> `llama-3.1-8b`; a config path -> its folder or file stem."""
    p = Path(model)
    name = p.parent.name if p.name == "config.json" else p.stem if p.suffix == ".json" else p.name
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "model"


def base_name(req: TraceRequest, mode: str) -> str:
    model = slug(req.model) + (f"-{slug(req.quantization)}" if req.quantization else "")
    if req.requests:
        s = f"{model}_serve_r{req.requests}_s{req.seed}_{mode}"
        return s + (f"_tp{req.tp}" if req.tp > 1 else "")
    s = f"{model}_{req.phase}_b{req.batch}_{mode}"
    return s + (f"_tp{req.tp}" if req.tp > 1 else "")


def model_arg(model: str) -> str:
    """Card names pass through; paths become absolute (the engine may run elsewhere)."""
    p = Path(model).expanduser()
    return str(p.resolve()) if ("/" in model or p.suffix == ".json") and p.exists() else model


def torch_engine_command(req: TraceRequest, mode: str, python: str = sys.executable) -> list[str]:
    """The torch engine's command line: one process, or one per rank via torch.distributed.run."""
    args = [
        "--model", model_arg(req.model),
        "--phase", req.phase,
        "--batch", str(req.batch),
        "--context", str(req.context),
        "--mode", mode,
        "--tp", str(req.tp),
        "--warmup", str(req.warmup),
    ]
    if req.layers:
        args += ["--layers", str(req.layers)]
    if req.untraced_steps is not None:
        args += ["--untraced-steps", str(req.untraced_steps)]
    if req.steps != 1:
        args += ["--steps", str(req.steps)]
    if req.step_name is not None:
        args += ["--step-name", req.step_name]
    if not req.nvtx:
        args += ["--no-nvtx"]
    if req.ops:
        args += ["--ops", req.ops]
    if req.emit_nvtx:
        args += ["--emit-nvtx"]
    module = "stepscope.capture.engines.torch_engine"
    if req.tp > 1:
        return [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(req.tp), "-m", module, *args]
    return [python, "-m", module, *args]


def engine_command(req: TraceRequest, engine: str, mode: str,
                   python: str = sys.executable) -> list[str]:
    if engine == "torch":
        return torch_engine_command(req, mode, python)
    return vllm_engine.command(req.model, phase=req.phase, batch=req.batch, context=req.context,
                               mode=mode, tp=req.tp, layers=req.layers, python=python,
                               model_arg=model_arg(req.model),
                               untraced_steps=req.untraced_steps,
                               inductor_names=req.inductor_names,
                               sync_scheduling=req.sync_scheduling,
                               kv_cache_gib=req.kv_cache_gib, serving=req.serving,
                               quantization=req.quantization)


def engine_env(engine: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the engine: stepscope importable, vLLM workers spawned, and none of
    the allocator/BLAS settings stepscope's own process runs with (native.child_env)."""
    from stepscope import native

    env = native.child_env(base)
    pp = env.get("PYTHONPATH", "")
    root = str(PACKAGE_ROOT)
    if root not in pp.split(os.pathsep):
        env["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if engine == "vllm":
        env.update(vllm_engine.env())
    return env


def analyze_command(sqlite: Path, as_json: bool, python: str = sys.executable) -> list[str]:
    cmd = [python, "-c", CLI_SHIM, "analyze", str(sqlite)]
    return cmd + (["--json"] if as_json else [])


# --- machine checks --------------------------------------------------------------------------
def gpu_count() -> tuple[int, str]:
    """(number of NVIDIA GPUs, how it was found); nvidia-smi first, then torch."""
    try:
        cp = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        if cp.returncode == 0:
            n = sum(1 for line in cp.stdout.splitlines() if line.startswith("GPU "))
            return n, "nvidia-smi"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), "torch"
    except Exception:
        pass
    return 0, "none"


def validate(req: TraceRequest) -> tuple[Card, str]:
    """Argument checks that need no GPU: the card, the engine, the numbers."""
    if req.phase not in PHASES:
        raise InputError(f"unknown phase {req.phase!r}: choose decode or prefill")
    if req.mode not in MODES:
        raise InputError(f"unknown mode {req.mode!r}: choose eager, graph, compiled or both")
    for name, v in (("batch", req.batch), ("context", req.context), ("tp", req.tp)):
        if v < 1:
            raise InputError(f"--{name} must be at least 1 (got {v})")
    if req.layers is not None and req.layers < 1:
        raise InputError(f"--layers must be at least 1 (got {req.layers})")
    if req.steps < 1:
        raise InputError(f"--steps must be at least 1 (got {req.steps})")
    if req.requests is not None:
        if req.requests < 1:
            raise InputError(f"--requests must be at least 1 (got {req.requests})")
        if req.engine == "torch":
            raise InputError("--requests runs vLLM's engine (a serving-like run): use "
                             "--engine vllm or leave --engine out")
        if req.mode in ("compiled",):
            raise InputError("--requests takes --mode eager, graph or both")
    if req.untraced_steps is not None and req.untraced_steps < 0:
        raise InputError(f"--untraced-steps must be 0 or more (got {req.untraced_steps})")
    card = load_card(req.model)
    # a model the torch engine cannot run (MoE, MLA, any non-Llama layer) goes to vLLM unless the
    # user named the torch engine: `trace --model qwen3-30b-a3b` needs no --engine
    other = card.architecture not in LLAMA_LIKE or card.is_moe or card.is_mla
    engine = "vllm" if req.requests or (req.engine is None and other) else pick_engine(req.engine)
    if engine == "vllm":
        torch_only = [name for name, on in (
            ("--mode compiled", req.mode == "compiled"), ("--steps", req.steps != 1),
            ("--step-name", req.step_name is not None), ("--no-nvtx", not req.nvtx),
            ("--ops", bool(req.ops)), ("--emit-nvtx", req.emit_nvtx)) if on]
        if torch_only:
            raise InputError(f"{', '.join(torch_only)}: torch engine only (--engine torch); "
                             "vLLM's graph mode already runs torch.compile")
    elif req.inductor_names:
        raise InputError("--inductor-names applies to the vLLM engine's graph mode only")
    if engine != "vllm" and (req.sync_scheduling or req.kv_cache_gib or req.quantization):
        raise InputError("--sync-scheduling, --kv-cache-gib and --quantization apply to the vLLM "
                         "engine only")
    if req.quantization is not None and not re.fullmatch(r"[a-z0-9_-]{1,40}", req.quantization):
        raise InputError(f"--quantization takes one of vLLM's method names (fp8, ...), got "
                         f"{req.quantization!r}")
    if engine == "vllm" and not vllm_available():
        if other:
            raise EnvironmentProblem(f"{card.name} ({card.architecture}) runs on vLLM's engine only, and vLLM is "
                                     "not installed here (pip install vllm)")
        raise EnvironmentProblem("--engine vllm needs vLLM, which is not installed here "
                                 "(pip install vllm), or use --engine torch")
    if engine == "vllm" and req.tp > 1:
        # vLLM's own checks, before a GPU is taken: heads split across the ranks, and (TP without
        # --enable-expert-parallel, what the engine starts) every expert's intermediate width too
        if card.num_attention_heads % req.tp:
            raise InputError(f"--tp {req.tp} does not divide {card.name}'s {card.num_attention_heads} heads")
        if card.is_moe and card.expert_intermediate_size % req.tp:
            raise InputError(f"--tp {req.tp} does not divide {card.name}'s expert intermediate size "
                             f"{card.expert_intermediate_size} (vLLM shards every expert across the ranks)")
    if engine == "torch":
        if other:
            kind = "a mixture of experts" if card.is_moe else "MLA" if card.is_mla else card.architecture
            raise InputError(f"the torch engine runs Llama-like dense models; {card.name} is {kind}: "
                             "use --engine vllm")
        if card.num_attention_heads % req.tp or card.intermediate_size % req.tp:
            raise InputError(f"--tp {req.tp} does not divide {card.name}'s "
                             f"{card.num_attention_heads} heads / {card.intermediate_size} "
                             "intermediate size")
    if req.serving:
        longest = req.serving["prompt_lens"][1] + req.serving["output_lens"][1]
        if longest + 1 > card.max_position_embeddings:
            raise InputError(f"prompts of {req.serving['prompt_lens'][1]} tokens and outputs "
                             f"of {req.serving['output_lens'][1]} exceed {card.name}'s "
                             f"{card.max_position_embeddings} positions")
    elif req.context + 1 > card.max_position_embeddings:
        raise InputError(f"--context {req.context} exceeds {card.name}'s "
                         f"{card.max_position_embeddings} positions")
    return card, engine


def preflight(req: TraceRequest) -> tuple[Card, str, nsys_mod.NsysCandidate]:
    card, engine = validate(req)
    n, _how = gpu_count()
    if n == 0:
        raise EnvironmentProblem("capture needs an NVIDIA GPU and none is visible here "
                                 "(nvidia-smi and torch see no device); run `stepscope doctor`")
    if req.tp > n:
        raise InputError(f"--tp {req.tp} needs {req.tp} GPUs but this machine has {n}")
    found = nsys_mod.discover()
    if found is None:
        raise EnvironmentProblem("nsys (Nsight Systems) not found: install it, put it on PATH "
                                 "or set NSYS=/path/to/nsys; run `stepscope doctor`")
    check = nsys_mod.check_importer(found.importer)
    if not check.ok:
        raise EnvironmentProblem(f"nsys at {found.path} cannot export: {check.problem}"
                                 + (f"; fix: {check.fix}" if check.fix else ""))
    return card, engine, found


# --- running ---------------------------------------------------------------------------------
PHASE_LABELS = {
    "start": "engine start",
    "build": "engine start (building the model)",
    "warmup": "warm-up",
    "untraced": "timing the untraced step (or run)",
    "capture": "capture",
    "export": "export (nsys → .sqlite)",
    "analysis": "analysis",
}


def _engine_phase(line: str) -> tuple[str | None, dict | None]:
    """Phase named by an engine log line, and the engine's result dict when it is one."""
    if ENGINE_TAG not in line:
        return None, None
    rest = line.split(ENGINE_TAG, 1)[1].strip()
    if rest.startswith("result="):
        try:
            return "export", json.loads(rest[len("result="):])
        except ValueError:
            return "export", None
    m = re.match(r"phase=(\w+)", rest)
    return (m.group(1) if m else None), None


def last_error_line(log: Path) -> str:
    """The most telling line of a failed engine log (the exception, or the last line)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if "error while loading shared libraries" in ln:
            return ln
        if re.match(r"^[\w.]*(Error|Exception)\b", ln) or f"{ENGINE_TAG} error=" in ln:
            return ln.split(f"{ENGINE_TAG} error=", 1)[-1]
    return lines[-1] if lines else ""


def run_capture(cap: Capture, env: dict[str, str], on_phase=None, poll_s: float = 0.5) -> Capture:
    """Run one `nsys profile` to completion, following the engine log for phases."""
    cap.base.parent.mkdir(parents=True, exist_ok=True)
    for p in (cap.sqlite, cap.nsys_rep):
        if p.exists():
            p.unlink()
    t0 = time.perf_counter()
    with open(cap.log, "w") as log:
        log.write("# " + " ".join(cap.command) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(cap.command, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)
        except OSError as e:
            raise EnvironmentProblem(f"cannot start {cap.command[0]}: {e}") from None
        pos = 0
        with open(cap.log, "rb") as follow:
            while True:
                rc = proc.poll()
                follow.seek(pos)
                data = follow.read()
                complete = data.rfind(b"\n") + 1
                pos += complete
                for line in data[:complete].decode(errors="replace").splitlines():
                    phase, result = _engine_phase(line)
                    if result is not None:
                        cap.engine_result = result
                    if phase and on_phase:
                        on_phase(phase)
                if rc is not None:
                    break
                time.sleep(poll_s)
    cap.returncode = proc.returncode
    cap.wall_s = time.perf_counter() - t0
    return cap


def check_capture(cap: Capture) -> None:
    if cap.returncode != 0:
        why = last_error_line(cap.log)
        raise EnvironmentProblem(f"the {cap.mode} capture failed (exit {cap.returncode})"
                                 + (f": {why}" if why else "") + f"; engine log: {cap.log}")
    if not cap.sqlite.exists():
        why = last_error_line(cap.log)
        raise EnvironmentProblem(f"nsys wrote no {cap.sqlite.name}"
                                 + (f" ({why})" if why else "") + f"; engine log: {cap.log}")


def sidecar_doc(cap: Capture, req: TraceRequest, engine: str, card: Card) -> dict | None:
    """The `.stepscope.json` sidecar of a capture (ingest/sidecar.py), from what the engine
    reported; None when the engine measured no untraced steps."""
    res = cap.engine_result or {}
    untraced = res.get("untraced")
    if not untraced:
        return None
    import platform

    versions = {"python": platform.python_version(), "torch": res.get("torch")}
    if engine == "vllm":
        versions["vllm"] = res.get("vllm")
    if req.serving:
        return {
            "engine": engine, "versions": versions, "device": res.get("device"),
            "shape": {"model": card.name, "phase": "serving", "mode": cap.mode, "tp": req.tp,
                      "layers": res.get("layers") or req.layers or card.num_hidden_layers,
                      "workload": res.get("workload")},
            "untraced": untraced,
            "capture": {k: v for k, v in res.items() if k != "untraced"},
        }
    return {
        "engine": engine,
        "versions": versions,
        "device": res.get("device"),
        "shape": {"model": card.name, "phase": req.phase, "batch": req.batch,
                  "context": req.context, "mode": cap.mode, "tp": req.tp,
                  "layers": res.get("layers") or req.layers or card.num_hidden_layers},
        "untraced": untraced,
        "capture": {k: v for k, v in res.items() if k != "untraced"},
    }


def write_capture_sidecar(cap: Capture, req: TraceRequest, engine: str, card: Card) -> None:
    from stepscope.ingest.sidecar import write_sidecar

    doc = sidecar_doc(cap, req, engine, card)
    if doc is not None:
        write_sidecar(cap.sidecar, doc)


def run_analysis(cap: Capture, as_json: bool, python: str = sys.executable) -> None:
    cmd = analyze_command(cap.sqlite, as_json, python)
    cp = subprocess.run(cmd, capture_output=True, text=True, env=engine_env("torch"))
    cap.analysis_rc = cp.returncode
    if as_json:
        try:
            cap.analysis = json.loads(cp.stdout)
        except ValueError:
            cap.analysis = {"error": (cp.stderr or cp.stdout).strip().splitlines()[-1:]}
    else:
        cap.analysis = cp.stdout if cp.returncode == 0 else (cp.stdout + cp.stderr)


def run_trace(req: TraceRequest, console=None) -> list[Capture]:
    """Check the machine, capture each requested mode, analyze each export."""
    from rich.console import Console

    console = console or Console(stderr=True)
    card, engine, found = preflight(req)
    req.out.mkdir(parents=True, exist_ok=True)
    env = engine_env(engine)
    captures: list[Capture] = []
    for mode in req.modes:
        base = req.out / base_name(req, mode)
        app = engine_command(req, engine, mode)
        cap = Capture(mode=mode, base=base,
                      command=nsys_mod.profile_command(found.path, base, app))
        label = (f"{card.name} serving run of {req.requests} requests {mode} tp={req.tp}"
                 if req.requests else
                 f"{card.name} {req.phase} b={req.batch} {mode} tp={req.tp} ({engine})")
        with console.status(f"{label}: {PHASE_LABELS['start']}") as status:
            def on_phase(phase: str, _s=status, _l=label) -> None:
                _s.update(f"{_l}: {PHASE_LABELS.get(phase, phase)}")

            if cap.sidecar.exists():
                cap.sidecar.unlink()  # a sidecar never outlives the export it describes
            run_capture(cap, env, on_phase)
            check_capture(cap)
            # the Arrow export beside the SQLite one, read without SQLite (ingest/nsys_columnar.py)
            note = nsys_mod.export_arrow(found.path, cap.nsys_rep, cap.base.with_name(cap.base.name + ".arrow"))
            if note:
                cap.notes.append(note)
            write_capture_sidecar(cap, req, engine, card)
            on_phase("analysis")
            run_analysis(cap, req.json)
        console.print(f"[green]captured[/] {label} in {cap.wall_s:.1f} s → {cap.sqlite}")
        captures.append(cap)
    return captures
