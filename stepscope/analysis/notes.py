"""A warning of an analysis as data: what happened (its code) and the figures that say how much,
never the sentence: render/sentences.py words it (warning_text), so the analyses write no
English and a renderer may word or lay it out its own way. The readers' warnings (about the
file itself) are still sentences; a trace's or an inventory's warnings are those sentences and
these notes, in the order they were found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# the codes, and the fields each one carries
NO_LAUNCHING_CALL = "no_launching_call"        # count: GPU activities without a launching call
EMPTY_STEP_RANGES = "empty_step_ranges"        # count: step ranges that launched no GPU work
PHASE_FROM_NAMES = "phase_from_names"          # count: steps whose phase only the kernel names give
ONE_STEP_STREAMS = "one_step_streams"          # count: process/device streams analyzed as one step
DIFFERENT_MODELS = "different_models"          # a, b: the two traces' model names (compare)
DIFFERENT_LAYERS = "different_layers"          # a, b: the two traces' layer counts (compare)
FEW_SHARED_LAUNCHES = "few_shared_launches"    # share: the kernel launches the traces share by name, 0-1
REPORTS_WITHOUT_START = "reports_without_start"  # count, first: a run's reports without a session start
STEP_REGEX_UNMATCHED = "step_regex_unmatched"  # regex, used: the pattern and the delimiters used instead
BAD_COVERAGE = "bad_coverage"                  # count, low, high (%), steps (the first five): coverage outside 0-100 %
BAD_TIMES = "bad_times"                        # count, what ("busy_over_span" or "negative"), steps (the first five)
SHARED_DEVICE = "shared_device"                # pids, device, both, least (ns): processes busy at once on one GPU
GRAPH_LEVEL_SIDE = "graph_level_side"          # side ("A" or "B"): the trace of two that records its graphs whole
CODES = (REPORTS_WITHOUT_START, GRAPH_LEVEL_SIDE, STEP_REGEX_UNMATCHED, BAD_COVERAGE, BAD_TIMES, SHARED_DEVICE,
         NO_LAUNCHING_CALL, EMPTY_STEP_RANGES, PHASE_FROM_NAMES, ONE_STEP_STREAMS, DIFFERENT_MODELS,
         DIFFERENT_LAYERS, FEW_SHARED_LAUNCHES)


@dataclass(frozen=True)
class Note:
    """One warning: its code (CODES) and its fields as (name, value) pairs (hashable: a set of
    warnings holds it)."""

    code: str
    fields: tuple[tuple[str, Any], ...] = ()

    def __getitem__(self, name: str) -> Any:
        return dict(self.fields)[name]


def note(code: str, **fields: Any) -> Note:
    if code not in CODES:
        raise ValueError(f"no warning code {code!r}")
    return Note(code, tuple(fields.items()))


def as_data(warnings) -> list:
    """The warnings as JSON values (a kept analysis stores them): a sentence as itself, a note
    as {"code", "fields"}."""
    return [w if isinstance(w, str) else {"code": w.code, "fields": dict(w.fields)} for w in warnings]


def from_data(values) -> list:
    """as_data's inverse (a list field comes back a tuple, as a Note holds it)."""
    return [v if isinstance(v, str) else note(v["code"], **{k: tuple(x) if isinstance(x, list) else x
                                                            for k, x in v["fields"].items()})
            for v in values]
