"""The capture sidecar: what `stepscope trace` measured about a step outside nsys's range.

nsys inflates the host side of a step (every CUDA call pays for its trace record), so the step
time read from the trace is not the one users see. The engines therefore also time the same
step shape *outside* the capture range (warm, several steps: wall clock around the engine step,
CUDA events around its GPU work) and `stepscope trace` writes those figures beside the export,
as `<name>.stepscope.json`:

    {"format": "stepscope-sidecar/1",
     "engine": "torch" | "vllm", "versions": {...}, "shape": {model, phase, batch, context,
     mode, tp, layers},
     "untraced": {"method": "...", "steps": N,
                  "step_time_ns": {median, p10, p90, min, max, n},   # the untraced step_time
                  "host_ns": {...},      # host time of one step (issue only, no GPU wait)
                  ... engine-specific series (vLLM: period_ns, sample_*_ns, per_token_wall_ns)},
     "capture": {...}}                   # what the engine said about the captured step

`step_time_ns` there is measured the way DEFINITIONS.md defines the traced figure: from the
step's start (or the previous GPU work's end, when the GPU was still busy) to the end of its
last GPU work, which two CUDA events bracketing the step give directly. The analyzer reads the
sidecar when it is present (`read_sidecar`) and reports both currencies.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

FORMAT = "stepscope-sidecar/1"
SUFFIX = ".stepscope.json"


def sidecar_path(trace: str | os.PathLike) -> Path:
    """`run/x.sqlite` -> `run/x.stepscope.json` (also for `x.nsys-rep`, `x.json.gz`, and nsys's columnar
    exports of the same report, `x.arrow` and the folder `x.parquetdir`)."""
    p = Path(trace)
    name = p.name
    for ext in (".json.gz", ".sqlite", ".nsys-rep", ".arrow", ".parquetdir", ".json", ".gz"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    return p.with_name(name + SUFFIX)


def stats(values_ns: Iterable[float]) -> dict[str, int] | None:
    """median, p10, p90, min, max and n of a series of nanoseconds (None when empty)."""
    v = sorted(float(x) for x in values_ns if x is not None and math.isfinite(float(x)))
    if not v:
        return None

    def q(f: float) -> int:  # nearest-rank quantile: a value that was measured
        return int(round(v[min(len(v) - 1, max(0, math.ceil(f * len(v)) - 1))]))

    mid = len(v) // 2
    median = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
    return {"median": int(round(median)), "p10": q(0.10), "p90": q(0.90),
            "min": int(round(v[0])), "max": int(round(v[-1])), "n": len(v)}


def write_sidecar(path: str | os.PathLike, doc: dict[str, Any]) -> Path:
    """Write the sidecar atomically (a temporary file beside it, then a rename)."""
    path = Path(path)
    doc = {"format": FORMAT, **{k: v for k, v in doc.items() if k != "format"}}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a sidecar is as readable as its export
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_sidecar(trace: str | os.PathLike) -> tuple[dict | None, str | None]:
    """(sidecar, warning) for a trace: (None, None) when there is none; a sidecar that cannot
    be read, or whose untraced step time is not a positive integer, gives (None, why)."""
    p = sidecar_path(trace)
    if not p.is_file():
        return None, None
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{p.name} is not readable JSON ({type(e).__name__}); ignored"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None, f"{p.name} is not a {FORMAT} sidecar; ignored"
    med = untraced_step_time_ns(doc)
    if med is None:
        return None, f"{p.name} has no positive untraced.step_time_ns.median; ignored"
    return doc, None


def untraced_step_time_ns(doc: dict | None) -> int | None:
    try:
        v = doc["untraced"]["step_time_ns"]["median"]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
