"""The what-if's errors on every committed eager/graph pair (docs/WHATIF.md's table).

    PYTHONPATH=$PWD python benchmarks/whatif_pairs.py

Per pair: the measured graph step (B's representative step), the point and range with the
bundled calibration, the point error, the error with B's own constants, and the point error with
the pair's own graph capture left out of the calibration (its role: calibrates / held out).
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import stepscope
from stepscope.analysis.whatif import Calibration, bundled

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
PAIRS = [
    "llama8b_decode_b1", "llama8b_decode_b8", "llama8b_decode_b1@_r4", "llama8b_decode_b1@_tp2",
    "round5/llama8b_decode_b1", "round5/llama8b_decode_b8", "vllm/llama8b_decode_b1", "vllm/llama8b_decode_b8",
    "vllm/qwen7b_decode_b1", "vllm/llama8b_prefill_b1",
    "pairs/torch_llama-3.2-1b_decode_b1", "pairs/vllm_llama-3.2-1b_decode_b1",
    "pairs/torch_llama-3.2-1b_decode_b32", "pairs/torch_qwen2.5-7b_decode_b16",
    "pairs/vllm_llama-3.2-1b_decode_b32", "pairs/vllm_llama-3.1-8b_decode_b32",
    "round8/vllm_llama-3.2-1b_decode_b1@_rep1", "round8/vllm_llama-3.2-1b_decode_b1@_rep2",
    "round8/vllm_qwen2.5-7b_decode_b1@_rep1", "round8/vllm_qwen2.5-7b_decode_b1@_rep2",
]


def files(p: str) -> tuple[Path, Path]:
    stem, _, tail = p.partition("@")
    return tuple(unpacked(FIX / f"{stem}_{mode}{tail}.sqlite") for mode in ("eager", "graph"))


def unpacked(path: Path) -> Path:
    """The export, or its gzip'd copy (`.sqlite.gz`, the eighth round's) unpacked beside its
    sidecar in a temporary folder."""
    if path.exists() or not path.with_name(path.name + ".gz").exists():
        return path
    folder = Path(tempfile.mkdtemp(prefix="whatif-pairs-"))
    with gzip.open(path.with_name(path.name + ".gz"), "rb") as src, open(folder / path.name, "wb") as dst:
        shutil.copyfileobj(src, dst)
    side = path.with_name(path.name.replace(".sqlite", ".stepscope.json"))
    if side.exists():
        shutil.copy(side, folder / side.name)
    return folder / path.name


def main() -> None:
    full = bundled()
    print("| pair | role | measured | point (error) | range | in range | with B's constants | left out |")
    print("|---|---|---|---|---|---|---|---|")
    for p in PAIRS:
        e, g = files(p)
        src = str(FIX.relative_to(ROOT) / p.partition("@")[0]) + f"_graph{p.partition('@')[2]}.sqlite"
        role = "calibrates" if any(c.source == src for c in full.captures) else "held out"
        doc = stepscope.compare(e, g)
        ref = doc.get("prediction_reference_ns") or doc["b"]["step_time_ns"]  # B without a replay: its step
        pt, lo, hi = (doc[f"predicted_graph_step_{k}_ns"] for k in ("time", "low", "high"))
        wb = doc.get("with_b_constants")
        rest = Calibration(tuple(c for c in full.captures if c.source != src), "held out")
        loo = (stepscope.compare(e, g, calibration=rest)["predicted_graph_step_time_ns"] - ref) / ref
        wbs = f"{100 * wb['prediction_error']:+.1f} %" if wb else "– (B has no replay)"
        print(f"| {p.replace('@', '')} | {role if wb else 'no replay in B'} | {ref / 1e6:.3f} ms | "
              f"{pt / 1e6:.3f} ms ({100 * (pt - ref) / ref:+.1f} %) | {lo / 1e6:.3f}–{hi / 1e6:.3f} ms | "
              f"{'yes' if lo <= ref <= hi else 'NO'} | {wbs} | {100 * loo:+.1f} % |")


if __name__ == "__main__":
    main()
