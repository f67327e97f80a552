"""`Dashboard(source)`: training curves, stage timeline, communication, partitions, the plan
(for a run trained from one) and the schedule explorer, live or replayed. Also the
``panel serve dashboard/app.py`` entry point."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import holoviews as hv
import pandas as pd
import panel as pn
import param

from dashboard import extension
from dashboard.page import CURVE_NAME
from dashboard.session import LiveView, Session
from dashboard.stream import Snapshot, as_source
from dashboard.views import comm as comm_views
from dashboard.views import metrics as metric_views
from dashboard.views import partitions as partition_views
from dashboard.views import plan as plan_views
from dashboard.views import ranks as rank_views
from dashboard.views.schedule import ScheduleExplorer
from dashboard.views.timeline import select_epoch, timeline_epochs, timeline_plot
from dashboard.views.whatif import whatif_panel
from gnnpipe.analysis.efficiency import Layout
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.prediction import Prediction
from gnnpipe.core.timeline import Timeline

if TYPE_CHECKING:
    from panel.io.callbacks import PeriodicCallback

__all__ = ["SLOW_VIEWS_PERIOD_S", "Dashboard"]

logger = logging.getLogger(__name__)
extension.load()

#: Seconds between redraws of the views replaced whole (bytes matrix and by kind, rank shares),
#: so a fast run does not keep a busy server re-rendering them every tick.
SLOW_VIEWS_PERIOD_S = 2.0
#: Exceptions tornado and bokeh log when a browser tab closes mid-update; the served app drops
#: just these (the training script's output stays clean).
_CLOSED_TAB_ERRORS = ("WebSocketClosedError", "StreamClosedError", "CancelledError")
_CLOSED_TAB_LOGGERS = ("tornado.application", "tornado.general", "bokeh.server.protocol_handler",
                       "bokeh.server.views.ws", "bokeh.server.session", "bokeh.document.document",
                       "bokeh.util.callback_manager", "bokeh.util.tornado", "asyncio")


def _name_curves(plot: Any, element: Any) -> None:
    renderer = plot.handles.get("glyph_renderer")
    if renderer is not None:
        renderer.name = CURVE_NAME


class _RanksCard:
    """Per-rank shares of the epoch and parallel efficiency (:mod:`dashboard.views.ranks`)."""

    def __init__(self, config: TrainConfig | None, timeline: Timeline,
                 memory: pd.DataFrame) -> None:
        self.config = config
        ranks = _run_ranks(config)
        shares, per_epoch = rank_views.rank_figures(timeline, config)
        self.shares = LiveView(lambda s: rank_views.shares_plot(s, ranks), shares,
                               sizing_mode="stretch_width")
        self.efficiency = LiveView(rank_views.efficiency_plot, per_epoch,
                                   sizing_mode="stretch_width")
        self.table = pn.pane.Markdown(rank_views.shares_table(shares, per_epoch), width=360)
        self.memory = pn.pane.Markdown(rank_views.memory_table(memory), width=260)
        self.layout = pn.Row(self.shares.pane, self.efficiency.pane,
                             pn.Column(self.table, self.memory), sizing_mode="stretch_width")
        self.epochs = tuple(timeline_epochs(timeline))

    def update(self, timeline: Timeline, memory: pd.DataFrame) -> None:
        """Redraw when the timeline holds other epochs than last time."""
        self.memory.object = rank_views.memory_table(memory)
        epochs = tuple(timeline_epochs(timeline))
        if epochs == self.epochs:
            return
        self.epochs = epochs
        shares, per_epoch = rank_views.rank_figures(timeline, self.config)
        self.shares.update(shares)
        self.efficiency.update(per_epoch)
        self.table.object = rank_views.shares_table(shares, per_epoch)


class _PlanCard:
    """What the plan predicted for every layout it weighed, and the running layout's measured
    epoch and peak beside its prediction (:mod:`dashboard.views.plan`)."""

    def __init__(self, prediction: Prediction, history: pd.DataFrame,
                 memory: pd.DataFrame) -> None:
        self.prediction = prediction
        self.measured = plan_views.measured_figures(history, memory)
        self.plot = LiveView(lambda m: plan_views.plan_plot(prediction, *m), self.measured,
                             width=plan_views.PLAN_WIDTH + 20)
        self.text = pn.pane.Markdown(plan_views.plan_text(prediction, *self.measured[:2]),
                                     width=plan_views.PLAN_WIDTH)
        self.layout = pn.Column(self.plot.pane, self.text)
        self.epochs = len(history)

    def update(self, history: pd.DataFrame, memory: Callable[[], pd.DataFrame],
               final: bool = False) -> None:
        """Move the measured point when epochs arrived (or the run ended) and the run's median
        epoch or largest peak changed; ``memory`` gives the per-rank peaks (asked only then)."""
        if len(history) == self.epochs and not final:
            return
        self.epochs = len(history)
        measured = plan_views.measured_figures(history, memory())
        if measured == self.measured:
            return
        self.measured = measured
        self.plot.update(measured)
        self.text.object = plan_views.plan_text(self.prediction, *measured[:2])


def _run_ranks(config: TrainConfig | None) -> int:
    """How many ranks a run's ``config`` asks for (0 for one-process modes)."""
    layout = Layout.of(config)
    return 0 if layout is None else layout.ranks


class _ClosedTabFilter(logging.Filter):
    """Drops the records of :data:`_CLOSED_TAB_ERRORS`: a browser tab closed mid-update."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _closed_tab(exc):
            return False
        message = record.getMessage()
        if message == _BARE_CALLBACK_ERROR:  # its traceback follows in the next record
            return False
        return not any(name in message for name in _CLOSED_TAB_ERRORS)


#: bokeh logs a periodic callback's failure as this line, then the traceback as text.
_BARE_CALLBACK_ERROR = "Error thrown from periodic callback:"


def _closed_tab(exc: BaseException) -> bool:
    """``exc`` or an exception it arose from is a closed tab's: one of
    :data:`_CLOSED_TAB_ERRORS`, or bokeh's assertion that a closing connection has a session
    (a tab closed before its session was set up)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in _CLOSED_TAB_ERRORS:
            return True
        tb = seen.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if isinstance(seen, AssertionError) and tb is not None and \
                tb.tb_frame.f_code.co_filename.endswith(("bokeh/server/connection.py",)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _quiet_closed_tabs() -> None:
    """Silence, in this process, what tornado and bokeh log when a browser tab closes (once)."""
    for name in _CLOSED_TAB_LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _ClosedTabFilter) for f in log.filters):
            log.addFilter(_ClosedTabFilter())


class Dashboard(param.Parameterized):
    """The gnnpipe dashboard for one run.

    Args:
        source: a live or finished ``Run``, a saved run folder (``runs/<id>/``) or trace file, or
            ``(scheduler address, run id)``. ``None`` shows the schedule explorer alone.
        predicted: a simulated ``Timeline`` drawn below the measured one (a static plot).
    """

    epoch = param.Integer(default=-1, doc="Epoch shown in the stage timeline; -1 follows the latest.")
    refresh_ms = param.Integer(default=500, bounds=(50, None), doc="Live update period.")
    title = param.String(default="gnnpipe", doc="Page title.")

    def __init__(self, source: Any = None, predicted: Timeline | None = None, **params: Any) -> None:
        super().__init__(**params)
        self._run = source
        self.source = as_source(source) if source is not None else None
        self.predicted = predicted

    # ------------------------------------------------------------------ layout
    def panel(self) -> pn.viewable.Viewable:
        """A fresh layout with its own live updates (one per browser session)."""
        if self.source is None:
            explorer = pn.Card(ScheduleExplorer().panel(), title="Schedule explorer")
            return pn.Column(pn.pane.Markdown(f"# {self.title}: schedule explorer"), explorer)
        session = Session(self.source)
        run = Snapshot(self.source.config, pd.DataFrame(), session.timeline(), pd.DataFrame(), True)
        explorer = pn.Card(pn.pane.Markdown(
            "Opened on this run's stages, chunks and *mean* forward, backward and transfer "
            "seconds, every op costing the same: a teaching model, so its makespan differs from "
            "the measured epoch. The What if card replays every op's own measured cost.",
            sizing_mode="stretch_width"), ScheduleExplorer.for_run(run).panel(),
            title="Schedule explorer")
        # the schedule the run's ops followed (a trace file without its job: gnnpipe's)
        own = "gnnpipe" if self.source.config is None else self.source.config.schedule.value
        whatif = pn.Card(whatif_panel(session.timeline(), own=own), title="What if",
                         collapsed=True)
        history, timeline = session.history(), session.timeline()
        config = self.source.config
        header = pn.pane.Markdown(self._header(history), name="header")
        losses = LiveView(self._named(metric_views.loss_plot), history)
        accuracy = LiveView(self._named(metric_views.accuracy_plot), history)
        times = LiveView(metric_views.epoch_time_plot, history)
        num_ranks = _run_ranks(config)
        epochs = timeline_epochs(timeline, num_ranks)  # epochs every rank has reported
        selector = pn.widgets.IntSlider(label="epoch (timeline)", start=min(epochs, default=0),
                                        end=max(max(epochs, default=0), 1),
                                        value=max(epochs, default=0))
        # an IntSlider given an int value holds an int (param types every value as optional)
        lanes = LiveView(lambda tl: self._timeline(tl, cast(int, selector.value), num_ranks),
                         timeline)
        relation = pn.pane.Markdown(rank_views.epoch_relation(timeline, config,
                                                              cast(int, selector.value)),
                                    sizing_mode="stretch_width")

        def show_epoch(tl: Timeline) -> None:
            lanes.update(tl)
            relation.object = rank_views.epoch_relation(tl, config, cast(int, selector.value))

        predicted = (pn.pane.HoloViews(timeline_plot(self.predicted, title="predicted"),
                                       linked_axes=False) if self.predicted is not None else None)
        selector.param.watch(lambda _: show_epoch(session.timeline()), "value")
        launch = self.source.launch
        predicted_bytes = launch.predicted_comm_bytes if launch is not None else None
        matrix = LiveView(lambda comm: comm_views.comm_matrix_plot(comm, num_ranks),
                          session.comm(), sizing_mode="stretch_width")
        kinds = LiveView(comm_views.bytes_by_kind_plot, session.comm(),
                         sizing_mode="stretch_width")
        per_epoch = LiveView(lambda h: comm_views.bytes_per_epoch_plot(h, predicted_bytes),
                             history, sizing_mode="stretch_width")
        difference = LiveView(lambda h: comm_views.bytes_difference_plot(h, predicted_bytes),
                              history, sizing_mode="stretch_width")
        ranks = _RanksCard(config, timeline, session.memory())
        prediction = self.source.prediction
        plan = (_PlanCard(prediction, history, session.memory()) if prediction is not None
                else None)
        grid = {"ncols": 2, "sizing_mode": "stretch_width"}
        cards = [
            pn.Card(pn.Row(losses.pane, accuracy.pane, times.pane), title="Training"),
            pn.Card(pn.Column(selector, lanes.pane, relation, *[p for p in [predicted] if p]),
                    title="Stage timeline"),
            pn.Card(ranks.layout, title="Ranks"),
            *([pn.Card(plan.layout, title="Plan")] if plan is not None else []),
            pn.Card(pn.GridBox(matrix.pane, kinds.pane, per_epoch.pane, difference.pane, **grid),
                    title="Communication"),
            pn.Card(self._partitions(), title="Partitions"),
            explorer, whatif,
        ]

        redrawn = [time.monotonic()]
        periodic: list[PeriodicCallback] = []  # the refresh's own callback, stopped at the end

        def refresh() -> None:
            if not session.poll():
                return
            hist, tl = session.history(), session.timeline()
            header.object = self._header(hist)
            for view in (losses, accuracy, times):
                view.update(hist)
            epochs_now = timeline_epochs(tl, num_ranks)
            if epochs_now:
                follow = selector.value == selector.end
                selector.end = max(max(epochs_now), 1)
                selector.start = min(min(epochs_now), selector.end - 1)
                if follow or self.epoch < 0:
                    selector.value = max(epochs_now)
                else:
                    show_epoch(tl)
            per_epoch.update(hist)
            difference.update(hist)
            if plan is not None:  # redraws only when the measured figures moved
                plan.update(hist, session.memory, session.final is not None)
            now = time.monotonic()
            if session.final is not None or now - redrawn[0] >= SLOW_VIEWS_PERIOD_S:
                redrawn[0] = now  # whole-plot redraws: at most once a period, and at the end
                comm = session.comm()
                matrix.update(comm)
                kinds.update(comm)
                ranks.update(tl, session.memory())
            if session.final is not None:  # the run ended: this was the last update
                whatif.objects = [whatif_panel(tl, own=own)]  # from the whole run's timeline
                periodic[0].stop()

        layout = pn.Column(header, *cards, sizing_mode="stretch_width")
        if session.final is None:
            periodic.append(pn.state.add_periodic_callback(refresh, self.refresh_ms))
        return layout

    def _header(self, history: pd.DataFrame) -> str:
        c = self.source.config if self.source else None
        if c is None:
            what, epochs = "an unknown job (followed by its run id)", len(history)
        else:
            what = (f"{c.model}-{c.layers} · mode **{c.mode}** · stages {c.stages} · "
                    f"chunks {c.chunks} · ways {c.ways}")
            epochs = c.epochs
        progress = metric_views.progress_text(history, epochs)
        return f"## {self.title}\n{what}  \n{progress}"

    @staticmethod
    def _named(fn: Callable[[pd.DataFrame], Any]) -> Callable[[pd.DataFrame], Any]:
        """Name the curves' bokeh renderers so a browser can find them."""
        return lambda history: fn(history).map(lambda el: el.opts(hooks=[_name_curves]), hv.Curve)

    @staticmethod
    def _timeline(timeline: Timeline, epoch: int, lanes: int) -> Any:
        shown = select_epoch(timeline, epoch) if len(timeline) else timeline
        return timeline_plot(shown, title=f"measured, epoch {epoch}", lanes=lanes)

    def _partitions(self) -> pn.viewable.Viewable:
        part = getattr(self.source, "partitioning", None)
        if part is None:
            why = getattr(self.source, "missing", "") or "a one-process mode"
            return pn.pane.Markdown(f"No partitioning for this run: {why}.")
        data = getattr(self.source, "data", None)
        plots = [partition_views.partition_sizes_plot(part), partition_views.halo_plot(part),
                 partition_views.edge_matrix_plot(part)]
        if data is not None:
            plots.append(partition_views.node_layout_plot(data, part))
        panes = [pn.pane.HoloViews(p, linked_axes=False, sizing_mode="stretch_width")
                 for p in plots]
        return pn.GridBox(*panes, ncols=2, sizing_mode="stretch_width")

    # ------------------------------------------------------------------ entry points
    def __panel__(self) -> pn.viewable.Viewable:
        return self.panel()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """The layout's MIME bundle, for front ends that ask for one (IPython uses
        :meth:`_ipython_display_`)."""
        return self.panel()._repr_mimebundle_(include, exclude)

    def _ipython_display_(self) -> None:
        """Jupyter displays a ``Dashboard`` that is a cell's value as its live layout; for a run
        still training it redraws that output once the run ends (when a cell waits for it,
        ``run.wait()``), so a saved or exported notebook shows the finished run, not its start."""
        from IPython.display import display, update_display

        data, metadata = self.panel()._repr_mimebundle_()
        handle = display(data, metadata=metadata, raw=True, display_id=True)
        when_done = getattr(self._run, "when_done", None)
        if handle is not None and callable(when_done):  # at once if it ended meanwhile
            def redraw(run: Any) -> None:  # a new Dashboard: the finished run's snapshot
                final, meta = Dashboard(run, self.predicted, title=self.title).panel(
                    )._repr_mimebundle_()
                update_display(final, metadata=meta, raw=True, display_id=handle.display_id)

            when_done(redraw)

    def servable(self, title: str | None = None) -> pn.viewable.Viewable:
        return self.panel().servable(title=title or self.title)

    def serve(self, port: int = 0, address: str = "127.0.0.1", show: bool = False) -> tuple[Any, str]:
        """Serve on ``address:port`` (localhost; port 0 picks a free one) in a background thread;
        returns ``(server, url)``. ``server.stop()`` ends it."""
        if port == 0:
            with socket.socket() as s:
                s.bind((address, 0))
                port = s.getsockname()[1]
        origins = [f"{address}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"]
        _quiet_closed_tabs()
        server = pn.serve({"/": self.panel}, port=port, address=address, show=show,
                          threaded=True, start=True, title=self.title, verbose=False,
                          websocket_origin=origins)
        return server, f"http://{address}:{port}/"

    def save(self, path: str | Path) -> Path:
        """A static HTML snapshot (plots as they are now; no live updates)."""
        path = Path(path)
        from bokeh.resources import INLINE  # what panel makes of resources="inline"

        self.panel().save(str(path), resources=INLINE, embed=False)
        return path


# `panel serve dashboard/app.py --args RUN_DIR` (or GNNPIPE_RUN=RUN_DIR): replay; no args: explorer
if __name__.startswith("bokeh"):
    target = os.environ.get("GNNPIPE_RUN") or (sys.argv[1] if len(sys.argv) > 1 else None)
    _quiet_closed_tabs()
    Dashboard(target).servable()
