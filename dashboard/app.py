"""`Dashboard(source)`: training curves, stage timeline, communication, partitions and the
schedule explorer, live or replayed. Also the ``panel serve dashboard/app.py`` entry point."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn
import param

from dashboard.stream import Source, as_source
from dashboard.views import comm as comm_views
from dashboard.views import metrics as metric_views
from dashboard.views import partitions as partition_views
from dashboard.views.schedule import ScheduleExplorer
from dashboard.views.timeline import select_epoch, timeline_epochs, timeline_plot
from gnnpipe.events import Timeline
from gnnpipe.run import HISTORY_COLUMNS

logger = logging.getLogger(__name__)
hv.extension("bokeh", logo=False)
pn.extension(notifications=False)

CURVE_NAME = "gnnpipe-training-curve"  # bokeh renderer name: browser tests count its points


def _name_curves(plot: Any, element: Any) -> None:
    renderer = plot.handles.get("glyph_renderer")
    if renderer is not None:
        renderer.name = CURVE_NAME


def _framewise(obj: Any) -> Any:
    """Let every element of a streamed frame rescale its axes to its own data."""
    return obj.map(lambda el: el.opts(framewise=True), lambda el: isinstance(el, hv.Element))


class LiveView:
    """One plot fed by the periodic callback. Streaming plots (curves that grow) go through a
    HoloViews ``Pipe`` into a framewise ``DynamicMap``; plots whose structure changes (new lanes,
    new kinds) are swapped into their pane whole."""

    def __init__(self, fn: Callable[[Any], Any], data: Any, stream: bool = False,
                 **pane_kwargs: Any) -> None:
        self.fn, self.stream = fn, stream
        if stream:
            self.pipe = hv.streams.Pipe(data=data)
            dmap = hv.DynamicMap(lambda data: _framewise(fn(data)), streams=[self.pipe])
            self.pane = pn.pane.HoloViews(dmap, linked_axes=False, **pane_kwargs)
        else:
            self.pane = pn.pane.HoloViews(fn(data), linked_axes=False, **pane_kwargs)

    def update(self, data: Any) -> None:
        if self.stream:
            self.pipe.send(data)
        else:
            self.pane.object = self.fn(data)


class _Session:
    """Per browser session (or notebook cell): cursors into the feed and the data drawn."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.record_cursor = self.op_cursor = 0
        self.records: list[dict[str, Any]] = []
        self.ops: list[dict[str, Any]] = []
        self.final = source.final()

    def poll(self) -> bool:
        """Take what arrived since last time; True if anything did."""
        if self.final is not None:
            return False
        records, ops, self.record_cursor, self.op_cursor = self.source.feed.since(
            self.record_cursor, self.op_cursor)
        self.records += records
        self.ops += ops
        if self.source.done:
            self.final = self.source.final()
            return True
        return bool(records or ops)

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

    def timeline(self) -> Timeline:
        return self.final.timeline if self.final is not None else Timeline.from_events(self.ops)

    def comm(self) -> pd.DataFrame:
        if self.final is not None and len(self.final.comm):
            return self.final.comm
        sends = self.timeline().df.query("kind == 'send'")
        return pd.DataFrame({"src": sends["rank"], "dst": sends["peer"], "kind": "send",
                             "bytes": sends["bytes"]})


class Dashboard(param.Parameterized):
    """The gnnpipe dashboard for one run.

    Args:
        source: a live or finished ``Run``, a saved run folder (``runs/<id>/``) or trace file, or
            ``(scheduler address, run id)``. ``None`` shows the schedule explorer alone.
        predicted: a simulated ``Timeline`` drawn beside the measured one.
    """

    epoch = param.Integer(default=-1, doc="Epoch shown in the stage timeline; -1 follows the latest.")
    refresh_ms = param.Integer(default=500, bounds=(50, None), doc="Live update period.")
    title = param.String(default="gnnpipe", doc="Page title.")

    def __init__(self, source: Any = None, predicted: Timeline | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.source = as_source(source) if source is not None else None
        self.predicted = predicted

    # ------------------------------------------------------------------ layout
    def panel(self) -> pn.viewable.Viewable:
        """A fresh layout with its own live updates (one per browser session)."""
        explorer = pn.Card(ScheduleExplorer().panel(), title="Schedule explorer", collapsed=False)
        if self.source is None:
            return pn.Column(pn.pane.Markdown(f"# {self.title}: schedule explorer"), explorer)
        session = _Session(self.source)
        history, timeline = session.history(), session.timeline()
        config = self.source.config
        header = pn.pane.Markdown(self._header(history), name="header")
        losses = LiveView(self._named(metric_views.loss_plot), history, stream=True)
        accuracy = LiveView(self._named(metric_views.accuracy_plot), history, stream=True)
        times = LiveView(metric_views.epoch_time_plot, history, stream=True)
        epochs = timeline_epochs(timeline)
        selector = pn.widgets.IntSlider(label="epoch (timeline)", start=0,
                                        end=max(max(epochs, default=0), 1),
                                        value=max(epochs, default=0))
        lanes = LiveView(lambda tl: self._timeline(tl, selector.value), timeline)
        selector.param.watch(lambda _: lanes.update(session.timeline()), "value")
        predicted_bytes = config.get("predicted_comm_bytes")
        matrix = LiveView(comm_views.comm_matrix_plot, session.comm())
        kinds = LiveView(comm_views.bytes_by_kind_plot, session.comm())
        per_epoch = LiveView(lambda h: comm_views.bytes_per_epoch_plot(h, predicted_bytes), history,
                             stream=True)
        cards = [
            pn.Card(pn.Row(losses.pane, accuracy.pane, times.pane), title="Training"),
            pn.Card(pn.Column(selector, lanes.pane), title="Stage timeline"),
            pn.Card(pn.Row(matrix.pane, kinds.pane, per_epoch.pane), title="Communication"),
            pn.Card(self._partitions(), title="Partitions"),
            explorer,
        ]

        def refresh() -> None:
            if not session.poll():
                return
            hist, tl = session.history(), session.timeline()
            header.object = self._header(hist)
            for view in (losses, accuracy, times):
                view.update(hist)
            epochs_now = timeline_epochs(tl)
            if epochs_now:
                follow = selector.value == selector.end
                selector.end = max(max(epochs_now), 1)
                if follow or self.epoch < 0:
                    selector.value = max(epochs_now)
                else:
                    lanes.update(tl)
            comm = session.comm()
            matrix.update(comm)
            kinds.update(comm)
            per_epoch.update(hist)
            if session.final is not None:  # the run ended: this was the last update
                layout._gnnpipe_callback.stop()

        layout = pn.Column(header, *cards, sizing_mode="stretch_width")
        if session.final is None:
            layout._gnnpipe_callback = pn.state.add_periodic_callback(refresh, self.refresh_ms)
        return layout

    def _header(self, history: pd.DataFrame) -> str:
        c = self.source.config if self.source else {}
        what = (f"{c.get('model', '?')}-{c.get('layers', '?')} · mode **{c.get('mode', '?')}** · "
                f"stages {c.get('stages', 1)} · chunks {c.get('chunks', 1)} · ways {c.get('ways', 1)}")
        progress = metric_views.progress_text(history, int(c.get("epochs", len(history)) or 0))
        return f"## {self.title}\n{what}  \n{progress}"

    @staticmethod
    def _named(fn: Callable[[pd.DataFrame], Any]) -> Callable[[pd.DataFrame], Any]:
        """Name the curves' bokeh renderers so a browser can find them."""
        return lambda history: fn(history).map(lambda el: el.opts(hooks=[_name_curves]), hv.Curve)

    def _timeline(self, timeline: Timeline, epoch: int) -> Any:
        shown = select_epoch(timeline, epoch) if len(timeline) else timeline
        predicted = self.predicted
        return timeline_plot(shown, title=f"measured, epoch {epoch}", predicted=predicted)

    def _partitions(self) -> pn.viewable.Viewable:
        part = getattr(self.source, "partitioning", None)
        if part is None:
            return pn.pane.Markdown("No partitioning recorded for this run (single mode, or a "
                                    "replayed folder).")
        data = getattr(self.source, "data", None)
        plots = [partition_views.partition_sizes_plot(part), partition_views.halo_plot(part),
                 partition_views.edge_matrix_plot(part)]
        if data is not None:
            plots.append(partition_views.node_layout_plot(data, part))
        sized = [p.opts(width=380, height=320, responsive=False) for p in plots]
        panes = [pn.pane.HoloViews(p, linked_axes=False) for p in sized]
        return pn.FlexBox(*panes)

    # ------------------------------------------------------------------ entry points
    def __panel__(self) -> pn.viewable.Viewable:
        return self.panel()

    def servable(self, title: str | None = None) -> pn.viewable.Viewable:  # type: ignore[override]
        return self.panel().servable(title=title or self.title)

    def serve(self, port: int = 0, address: str = "127.0.0.1", show: bool = False) -> tuple[Any, str]:
        """Serve on ``address:port`` (localhost; port 0 picks a free one) in a background thread;
        returns ``(server, url)``. ``server.stop()`` ends it."""
        if port == 0:
            with socket.socket() as s:
                s.bind((address, 0))
                port = s.getsockname()[1]
        origins = [f"{address}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"]
        server = pn.serve({"/": self.panel}, port=port, address=address, show=show,
                          threaded=True, start=True, title=self.title, verbose=False,
                          websocket_origin=origins)
        return server, f"http://{address}:{port}/"

    def save(self, path: str | Path) -> Path:
        """A static HTML snapshot (plots as they are now; no live updates)."""
        path = Path(path)
        self.panel().save(str(path), resources="inline", embed=False)
        return path


# `panel serve dashboard/app.py --args RUN_DIR` (or GNNPIPE_RUN=RUN_DIR): replay; no args: explorer
if __name__.startswith("bokeh"):
    import sys

    target = os.environ.get("GNNPIPE_RUN") or (sys.argv[1] if len(sys.argv) > 1 else None)
    Dashboard(target).servable()
