"""The what-if's calibration: the constants measured on graph captures, and its file.

A calibration is a list of captures (one graph trace each, with its GPU, engine, graph size and
source named), read from and written to a JSON file (`stepscope calibrate` writes them;
FORMAT). analysis/whatif.py measures the captures and applies them; docs/DEFINITIONS.md defines
each constant. Kept outside the analyses: it reads and writes files.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stepscope.errors import InputError

CONSTANTS = ("graph_launch_prep_ns", "graph_launch_lead_ns", "node_gap_ns", "memop_gap_ns")
BUNDLED = Path(__file__).resolve().parent / "data" / "calibration.json"
FORMAT = "stepscope-calibration/1"
# A replay "with memsets" holds at least one memset node per MEMSET_EVERY kernels (one per layer,
# e.g. cuDNN attention's workspace memset). On every committed capture the graph launch lead
# follows that split: 0.09-0.13 ms with memsets (7 captures), 0.63-1.15 ms without (4 captures, the
# first round's torch engine and every vLLM graph): the point takes the captures of the step's mode.
MEMSET_EVERY = 64


def with_memsets(memops, kernels) -> bool:
    """Whether a replay (or an eager step's forward) of `kernels` kernels and `memops` memsets and
    memcpys is one "with memsets" (MEMSET_EVERY)."""
    return bool(memops) and memops * MEMSET_EVERY >= (kernels or 0)


@dataclass(frozen=True)
class GraphConstants:
    graph_launch_prep_ns: float  # prologue end (or step begin) → the cudaGraphLaunch call's start
    graph_launch_lead_ns: float  # the cudaGraphLaunch call's start → the replay's first node
    node_gap_ns: float           # idle per kernel inside a replay (device-side launch latency)
    memop_gap_ns: float          # idle per memset/memcpy node inside a replay
    source: str = ""
    prologue_host_ns: float | None = None  # a graph step's host time before its replay (None: the step's own)
    device_ratio: float = 1.0    # graph-mode device work / eager device floor of the same step
    host_after_ns: float | None = None  # the host from the graph launch call's start to its own end
    prologue_always: bool = False  # the engine always prepares its inputs: P even without a seen prologue

    @property
    def lead_ns(self) -> float:
        """The host-and-launch part before the replay's first node, beyond the prologue."""
        return self.graph_launch_prep_ns + self.graph_launch_lead_ns


@dataclass(frozen=True)
class Capture:
    """One calibration capture: a graph trace's constants (medians over its graph steps)."""

    source: str           # the file's name
    gpu: str | None
    engine: str           # "vllm", "torch" (stepscope's torch engine) or "unknown"
    nodes: int            # kernels of its graph replay (the median step's)
    memops: int           # memops of its replay
    steps: int            # graph steps measured
    step_time_ns: int     # its measured graph step (median)
    device_floor_ns: int  # its device floor (median)
    prologue_busy_ns: int  # its prologue's device time (median)
    graph_launch_prep_ns: float
    graph_launch_lead_ns: float
    node_gap_ns: float
    memop_gap_ns: float | None  # None: the replay has no memop
    prologue_host_ns: float | None = None  # its prologue's host time (None: no prologue)
    eager_twin: str | None = None  # the eager capture of the same step, when calibrate was given it
    device_ratio: float | None = None  # its graph busy / the twin's device floor (None: no twin)
    residual: float | None = None  # (measured − predicted from the twin with these constants) / measured
    host_after_ns: float | None = None  # its last launch call's end (and the host's own tail) − graph launch start
    loo_error: float | None = None  # (the twin's what-if with the other captures' point − measured) / measured

    def constants(self, fallback: GraphConstants | None = None) -> GraphConstants:
        """Its own constants; one it lacks (no memop, no prologue, no twin) from `fallback`."""
        # alone, a capture whose replay has a prologue stands for an engine that always has one
        f = fallback or GraphConstants(0.0, 0.0, 0.0, 0.0, prologue_always=self.prologue_host_ns is not None)
        return GraphConstants(
            self.graph_launch_prep_ns, self.graph_launch_lead_ns, self.node_gap_ns,
            self.memop_gap_ns if self.memop_gap_ns is not None else f.memop_gap_ns, self.named(),
            self.prologue_host_ns if self.prologue_host_ns is not None else f.prologue_host_ns,
            self.device_ratio if self.device_ratio is not None else f.device_ratio,
            self.host_after_ns if self.host_after_ns is not None else f.host_after_ns, f.prologue_always)

    def named(self) -> str:
        return f"{self.source} ({self.gpu or 'GPU not named'}, {self.engine}, {self.nodes} nodes)"


@dataclass(frozen=True)
class Calibration:
    captures: tuple[Capture, ...]
    origin: str = "bundled"  # "bundled", or the file it was read from
    notes: tuple[str, ...] = field(default_factory=tuple)

    def members(self, engine: str | None = None, memsets: bool | None = None) -> tuple[Capture, ...]:
        """The captures that calibrate a step of `engine`: those of the same engine, else all; with
        `memsets` given, those of them whose replay is of that mode (with_memsets), when any is."""
        same = tuple(c for c in self.captures if engine is not None and c.engine == engine) or self.captures
        if memsets is None:
            return same
        return tuple(c for c in same if with_memsets(c.memops, c.nodes) == memsets) or same

    def point(self, engine: str | None = None, memsets: bool | None = None) -> GraphConstants:
        """The median of each constant over members(engine, memsets) (over those that have it)."""
        m = self.members(engine, memsets)

        def med(k: str, default=None):
            v = [getattr(c, k) for c in m if getattr(c, k) is not None]
            return statistics.median(v) if v else default

        memop_all = [c.memop_gap_ns for c in self.captures if c.memop_gap_ns is not None]
        return GraphConstants(
            med("graph_launch_prep_ns"), med("graph_launch_lead_ns"), med("node_gap_ns"),
            med("memop_gap_ns", statistics.median(memop_all) if memop_all else 0.0),
            f"median of {len(m)} graph capture{'s' * (len(m) != 1)} ({self.origin})",
            med("prologue_host_ns"), med("device_ratio", 1.0), med("host_after_ns"),
            # every member is of the step's engine and has a prologue: that engine always prepares
            # its inputs before the replay, whether or not the eager trace shows where its forward starts
            bool(engine) and all(c.engine == engine and c.prologue_host_ns is not None for c in m))

    def spread(self, engine: str | None = None) -> list[GraphConstants]:
        """Each member's own constants (one it lacks: the point's)."""
        p = self.point(engine)
        return [c.constants(p) for c in self.members(engine)]

    def errors(self, engine: str | None = None) -> tuple[float, float]:
        """The lowest (≤ 0) and highest (≥ 0) held-out error of the members with a twin: how far
        the point calibrated without a capture missed that capture's own step."""
        r = [c.loo_error for c in self.members(engine) if c.loo_error is not None]
        return min([0.0, *r]), max([0.0, *r])

    def describe(self, engine: str | None = None, memsets: bool | None = None) -> dict:
        """What the output names: the point constants and every capture behind them."""
        p = self.point(engine, memsets)
        return {"origin": self.origin, "engine": engine, "memsets": memsets,
                **{k: round(getattr(p, k), 1) for k in CONSTANTS}, "source": p.source,
                "captures": [asdict(c) for c in self.members(engine, memsets)]}

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "captures": [asdict(c) for c in self.captures]}, indent=1) + "\n"


def read_calibration(path: str | Path, origin: str | None = None) -> Calibration:
    """A calibration file (`stepscope calibrate` writes them); InputError saying what is wrong."""
    from stepscope.paths import input_file, shown

    p = input_file(path, "a calibration file written by `stepscope calibrate`")
    try:
        doc = json.loads(p.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, not {FORMAT!r}")
        caps = tuple(Capture(**c) for c in doc["captures"])
        if not caps:
            raise ValueError("no capture in it")
        for c in caps:
            for k in CONSTANTS[:3]:
                v = getattr(c, k)
                if not isinstance(v, (int, float)) or not 0 <= v < 1e9:
                    raise ValueError(f"{c.source}: {k} = {v!r}")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{shown(p)}: not a stepscope calibration file ({e}); write one with "
                         "`stepscope calibrate GRAPH_TRACE... -o FILE`") from None
    return Calibration(caps, origin or shown(p))


def user_calibration_path() -> Path:
    """$XDG_CONFIG_HOME/stepscope/calibration.json (~/.config/... without XDG_CONFIG_HOME)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "stepscope" / "calibration.json"


_BUNDLED: Calibration | None = None


def bundled() -> Calibration:
    global _BUNDLED
    if _BUNDLED is None:
        _BUNDLED = read_calibration(BUNDLED, "bundled")
    return _BUNDLED


def default_calibration() -> Calibration:
    """The user's calibration file (user_calibration_path) when it exists, else the bundled one."""
    user = user_calibration_path()
    return read_calibration(user) if user.is_file() else bundled()
