"""Schedule explorer: pick a pipeline schedule and op costs, watch the simulated timeline."""

from __future__ import annotations

import holoviews as hv
import panel as pn
import param

from dashboard.views.timeline import timeline_plot
from gnnpipe import schedule as schedules
from gnnpipe.events import Timeline
from gnnpipe.schedule import Schedule
from gnnpipe.simulate import simulate

#: Schedule builders by the names :attr:`ScheduleExplorer.schedule` accepts.
BUILDERS = {
    "gnnpipe": schedules.gnnpipe,
    "gpipe": schedules.gpipe,
    "1f1b": schedules.one_f_one_b,
}
_INPUTS = ["schedule", "stages", "chunks", "forward", "backward", "comm"]


def bubble_formula(stages: int, chunks: int) -> float:
    """Idle fraction ``(S − 1) / (C + S − 1)`` of a fill-drain pipeline with equal op costs."""
    return (stages - 1) / (chunks + stages - 1)


class ScheduleExplorer(param.Parameterized):
    """A teaching tool: simulate a pipeline schedule and show its timeline and bubble.

    Every widget move re-simulates (``gp.simulate``) and redraws; the summary compares the
    simulated bubble with the equal-cost formula ``(S − 1) / (C + S − 1)``.
    """

    schedule = param.ObjectSelector(
        default="gnnpipe", objects=list(BUILDERS),
        doc="Schedule family: GNNPipe's chunked fill-drain, GPipe, or 1F1B (PipeDream-flush).")
    stages = param.Integer(
        default=4, bounds=(1, 16), doc="Pipeline stages S (one rank each).")
    chunks = param.Integer(
        default=8, bounds=(1, 64), doc="Chunks (micro-batches) per epoch C.")
    forward = param.Number(
        default=1.0, bounds=(0.0, None), softbounds=(0.0, 5.0), step=0.1,
        doc="Seconds of one forward op (one chunk at one stage).")
    backward = param.Number(
        default=2.0, bounds=(0.0, None), softbounds=(0.0, 5.0), step=0.1,
        doc="Seconds of one backward op (one chunk at one stage).")
    comm = param.Number(
        default=0.0, bounds=(0.0, None), softbounds=(0.0, 2.0), step=0.05,
        doc="Seconds of transfer on every cross-stage dependency (activation or gradient).")

    def build(self) -> Schedule:
        """The schedule the parameters describe."""
        return BUILDERS[self.schedule](self.stages, self.chunks)

    @param.depends(*_INPUTS)
    def timeline(self) -> Timeline:
        """The predicted timeline of :meth:`build` with the forward/backward/comm costs."""
        costs = {"forward": self.forward, "backward": self.backward}
        return simulate(self.build(), costs, comm=self.comm)

    def bubble(self) -> float:
        """Simulated idle fraction of rank time (``Timeline.bubble_fraction``)."""
        return self.timeline().bubble_fraction()

    def formula(self) -> float:
        """The equal-cost fill-drain bubble ``(S − 1) / (C + S − 1)``."""
        return bubble_formula(self.stages, self.chunks)

    @param.depends(*_INPUTS)
    def plot(self) -> hv.Rectangles:
        """The simulated timeline, one lane per rank (:func:`timeline_plot`)."""
        title = f"{self.schedule}, S={self.stages}, C={self.chunks}"
        return timeline_plot(self.timeline(), title=title)

    @param.depends(*_INPUTS)
    def summary(self) -> str:
        """Markdown comparing the simulated bubble with the formula."""
        tl = self.timeline()
        return (
            f"**bubble {tl.bubble_fraction():.1%}** (simulated) · "
            f"formula (S−1)/(C+S−1) = ({self.stages}−1)/({self.chunks}+{self.stages}−1) = "
            f"**{self.formula():.1%}** · makespan {tl.makespan():.4g} s · "
            f"peak chunks in flight {int(tl.peak_inflight().max())}"
        )

    def panel(self) -> pn.Row:
        """Widgets on the left; the live timeline and the bubble summary on the right."""
        widgets = pn.Param(self, parameters=_INPUTS, name="Schedule", width=260)
        plot = pn.pane.HoloViews(self.plot, sizing_mode="stretch_width", backend="bokeh")
        text = pn.pane.Markdown(self.summary, sizing_mode="stretch_width")
        return pn.Row(widgets, pn.Column(plot, text, sizing_mode="stretch_width"),
                      sizing_mode="stretch_width")
