"""What a browser session (or a notebook cell) holds of a run: cursors into its live feed, the
latest window of timeline ops and byte counters (:class:`Session`), and the plots fed through
HoloViews pipes (:class:`LiveView`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn

from dashboard.stream import Source
from gnnpipe.core.timeline import Timeline
from gnnpipe.run import HISTORY_COLUMNS, memory_from

__all__ = ["WINDOW_EPOCHS", "LiveView", "Session"]

#: Epochs of ops a live session keeps (the timeline's epoch slider spans these); older ones go.
WINDOW_EPOCHS = 20


def _framewise(obj: Any) -> Any:
    """Let every element of a streamed frame rescale its axes to its own data."""
    return obj.map(lambda el: el.opts(framewise=True), lambda el: isinstance(el, hv.Element))


class LiveView:
    """One plot fed by the periodic callback, through a HoloViews ``Pipe`` into a framewise
    ``DynamicMap``: an update sends the browser new data for the plot it already drew. (Swapping
    a new plot into a pane makes the browser build and lay out that plot again; on a busy
    machine a few swaps a second kept a 16-plot page from rendering for over a minute.) ``fn``
    must return the same kind of element for every update, categorical axes from the start."""

    def __init__(self, fn: Callable[[Any], Any], data: Any, **pane_kwargs: Any) -> None:
        self.pipe = hv.streams.Pipe(data=data)
        dmap = hv.DynamicMap(lambda data: _framewise(fn(data)), streams=[self.pipe])
        self.pane = pn.pane.HoloViews(dmap, linked_axes=False, **pane_kwargs)

    def update(self, data: Any) -> None:
        self.pipe.send(data)


class Session:
    """Per browser session (or notebook cell): cursors into the feed and the data drawn."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.record_cursor = self.op_cursor = 0
        self.records: list[dict[str, Any]] = []
        self.ops: dict[int, list[dict[str, Any]]] = {}  # epoch -> ops, last WINDOW_EPOCHS only
        self.counters: dict[int, list[dict[str, Any]]] = {}  # rank -> its byte counters so far
        self._timeline: Timeline | None = None
        self.final = source.final()

    def poll(self) -> bool:
        """Take what arrived since last time; True if anything did."""
        if self.final is not None:
            return False
        records, ops, self.record_cursor, self.op_cursor = self.source.feed.since(
            self.record_cursor, self.op_cursor)
        self.records += records
        self._take(records, ops)
        if self.source.done:
            self.final = self.source.final()
            return True
        return bool(records or ops)

    def _take(self, records: list[dict[str, Any]], ops: list[dict[str, Any]]) -> None:
        """Keep the ops of the latest :data:`WINDOW_EPOCHS` epochs and each rank's latest
        byte counters (records carry them as ``comm``)."""
        for record in records:
            if "comm" in record and "rank" in record:
                self.counters[int(record["rank"])] = record["comm"]
        for op in ops:
            self.ops.setdefault(int(op["epoch"]), []).append(op)
        for epoch in sorted(self.ops)[:-WINDOW_EPOCHS]:
            del self.ops[epoch]
        if ops:
            self._timeline = None

    def history(self) -> pd.DataFrame:
        if self.final is not None:
            return self.final.history
        if not self.records:
            return pd.DataFrame(columns=list(HISTORY_COLUMNS))
        from gnnpipe.runtime.launch import history_from

        frame = pd.DataFrame(self.records)
        if "rank" not in frame:  # one-process runs report whole rows
            return frame.reindex(columns=list(HISTORY_COLUMNS))
        return history_from(self.records)

    def memory(self) -> pd.DataFrame:
        """Per rank peak memory: the final table, else the latest the ranks' records carry."""
        if self.final is not None:
            return self.final.memory
        return memory_from([r for r in self.records if "rank" in r])

    def timeline(self) -> Timeline:
        if self.final is not None:
            return self.final.timeline
        if self._timeline is None:
            self._timeline = Timeline.from_events(op for ops in self.ops.values() for op in ops)
        return self._timeline

    def comm(self) -> pd.DataFrame:
        """Bytes per (src, dst, kind) as ``Run.comm`` counts them: the final table, else the
        ranks' latest live counters, else (a feed without counters) the timeline's sends."""
        if self.final is not None and len(self.final.comm):
            return self.final.comm
        if self.counters:
            return pd.DataFrame([row for rows in self.counters.values() for row in rows],
                                columns=["src", "dst", "kind", "bytes"])
        sends = self.timeline().df.query("kind == 'send'")
        return pd.DataFrame({"src": sends["rank"], "dst": sends["peer"], "kind": "send",
                             "bytes": sends["bytes"]})
