"""What an analysis keeps alive, and when it lets go: the memory policy of a one-shot run.

A notebook (NOTEBOOK, the API's) keeps the whole inventory, since it may ask for any step's
activities later, but lets go of the trace's own kernel, memop and API frames once the activity
frame holds their rows (model.Trace.read_events reads them again from the trace's file, its
Parquet cache when it has one), and keeps of the API calls only the synchronizing ones (the launch calls
are on the activities' rows and in the inventory's launch calls). KEEP keeps every frame. A
command that renders from the inventory (ONE_PASS: report, budget, tp) lets go of the trace's
own event frames for good; `export` (EXPORT) also narrows the activities to the columns its
events are written from, as a one-shot run does to its own, and keeps no launch calls (it reads
them off the activities). A one-shot CLI run (ONE_SHOT: `analyze`) reads each frame once, so it empties the trace's kernel, memop and API
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


# What `export` writes its events from besides those: each activity's stream, launching thread,
# correlation id and bytes, and the kernels' grid/block where the trace was read with them.
EXPORT_ACT_COLUMNS = ONE_SHOT_ACT_COLUMNS + ("stream", "tid", "corr", "bytes", "grid_x", "grid_y", "grid_z",
                                             "block_x", "block_y", "block_z")


@dataclass(frozen=True)
class Retention:
    """KEEP, NOTEBOOK, ONE_PASS, EXPORT or ONE_SHOT; the analyses call its hooks where a frame may go."""

    # only per-step results are read after: the activities narrowed to ONE_SHOT_ACT_COLUMNS,
    # and every per-event frame let go once the results exist
    one_shot: bool = False
    # the trace's own kernel, memop and API frames go once the activity frame holds their rows
    drop_inputs: bool = False
    # ... and may be read again from the trace's file (model.Trace.read_events)
    reread: bool = False
    # the activity columns kept once the launch calls are extracted (None: every column;
    # one_shot: ONE_SHOT_ACT_COLUMNS)
    act_columns: tuple[str, ...] | None = None
    # ... and of the API calls only the synchronizing ones, which the gap attribution reads (a
    # report's launch table reads the others; one_shot: always)
    sync_calls_only: bool = False
    # the inventory keeps each step's launch calls (the diagnosis reads them; an export does not)
    launch_calls: bool = True

    def activities_built(self, trace) -> None:
        """The activity frame holds the trace's kernel and memop rows and their launch calls."""
        if self.one_shot or self.drop_inputs:
            trace.drop_event_frames(reread=self.reread and not self.one_shot)

    def launch_calls_found(self, acts: pl.DataFrame, api: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Each step's launch calls are extracted: what the rest of the analysis needs of the
        activities and the API calls."""
        cols = ONE_SHOT_ACT_COLUMNS if self.one_shot else self.act_columns
        if cols is not None:
            acts = acts.select([c for c in cols if c in acts.columns])
        return acts, api.filter(pl.col("is_sync")) if self.one_shot or self.sync_calls_only else api

    def inventory_built(self, inv) -> None:
        """The inventory is complete; what its caller reads of it is all that is left to do."""
        if not self.launch_calls:
            inv.launch_calls = inv.launch_calls.clear()

    def results_ready(self, diagnosis) -> None:
        """The per-step results exist and only they are written (a JSON document)."""
        if self.one_shot:
            diagnosis.drop_event_frames()


KEEP = Retention(False)
# the API's: the inventory stays whole; the trace's event frames come back from its file by Trace.read_events
NOTEBOOK = Retention(False, drop_inputs=True, reread=True, sync_calls_only=True)
# a command that reads the trace once but renders from its activities (report, budget, tp): the
# inventory stays whole, the frames it was built from do not
ONE_PASS = Retention(False, drop_inputs=True)
# `export`: the activities, narrowed to what its events are written from; no diagnosis follows
EXPORT = Retention(False, drop_inputs=True, act_columns=EXPORT_ACT_COLUMNS, sync_calls_only=True, launch_calls=False)
ONE_SHOT = Retention(True)
