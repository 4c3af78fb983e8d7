"""What an analysis keeps alive, and when it lets go: the memory policy of a one-shot run.

A notebook keeps every frame (KEEP): it may ask for any step's activities later. A command that
renders from the inventory (ONE_PASS: report, export, budget, compare) lets go of the trace's own
event frames once the activity frame holds their rows. A one-shot CLI
run (ONE_SHOT: `analyze`) reads each frame once, so it empties the trace's kernel, memop and API
frames as soon as the activity frame holds their rows, keeps of the API calls only the
synchronizing ones (the gap attribution reads them) once the launch calls are extracted, narrows
the activities to ONE_SHOT_ACT_COLUMNS, and — for a document written from per-step results —
drops the per-event frames once those results exist. A million-kernel trace's API frame is
~40 MB and each activity column ~8 MB: released early, they never sit beside the frames built
after them. The analyses call the policy at those points and define nothing else about memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

# The activity columns a one-shot analysis keeps once its launch calls are extracted: what the
# per-step figures, the diagnosis (gaps, launch, floors, what-if) and `analyze`'s renderers read.
ONE_SHOT_ACT_COLUMNS = ("step", "device", "pid", "start", "end", "prev_end", "is_kernel", "name",
                        "demangled", "demangled_id", "class", "launch_start", "launch_end",
                        "launch_api", "graph_node_id")


@dataclass(frozen=True)
class Retention:
    """KEEP, ONE_PASS or ONE_SHOT; the analyses call its hooks where a frame may go."""

    one_shot: bool = False
    # the trace's own kernel, memop and API frames go once the activity frame holds their rows
    drop_inputs: bool = False

    def activities_built(self, trace) -> None:
        """The activity frame holds the trace's kernel and memop rows and their launch calls."""
        if self.one_shot or self.drop_inputs:
            trace.drop_event_frames()

    def launch_calls_found(self, acts: pl.DataFrame, api: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Each step's launch calls are extracted: what the rest of the analysis needs of the
        activities and the API calls."""
        if not self.one_shot:
            return acts, api
        return acts.select(ONE_SHOT_ACT_COLUMNS), api.filter(pl.col("is_sync"))

    def results_ready(self, diagnosis) -> None:
        """The per-step results exist and only they are written (a JSON document)."""
        if self.one_shot:
            diagnosis.drop_event_frames()


KEEP = Retention(False)
# a command that reads the trace once but renders from its activities (report, export, budget,
# compare): the inventory stays whole, the frames it was built from do not
ONE_PASS = Retention(False, drop_inputs=True)
ONE_SHOT = Retention(True)
