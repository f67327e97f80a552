"""Schedule explorer: two pipeline schedules, one above the other on one time axis, their
simulated timelines, bubbles beside the published formulas (with their papers and every symbol
defined), and a player whose cursor shows what every rank runs and holds at one instant."""

from __future__ import annotations

from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn
import param

from dashboard.views.timeline import timeline_plot
from gnnpipe.analysis.catalogue import CATALOGUE, SYMBOLS, bubble_formula, build
from gnnpipe.analysis.whatif import OpCosts, costs_from, predict
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.timeline import Timeline
from gnnpipe.schedule import Schedule

__all__ = ["BUILDERS", "ScheduleExplorer"]

#: Schedule names the explorer offers: gnnpipe's and PyTorch's
#: (:data:`gnnpipe.analysis.catalogue.CATALOGUE`).
BUILDERS = CATALOGUE
_INPUTS = ["schedule", "other", "stages", "chunks", "virtual", "forward", "backward", "comm"]
_SIDES = ("schedule", "other")


def _side(which: str) -> str:
    if which not in _SIDES:
        raise ValueError(f"which: expected one of {_SIDES}, got {which!r}")
    return which


class ScheduleExplorer(param.Parameterized):
    """A teaching tool: simulate two pipeline schedules and compare timelines and bubbles.

    Op costs are per full stage: with ``v`` virtual stages (interleaved 1F1B) each op costs
    ``1/v`` of them, and ZB-H1 splits ``backward`` into input and weight halves. ``step`` is the
    player's position: an index into the instants where some op starts or ends.
    """

    schedule = param.ObjectSelector(
        default="gnnpipe", objects=list(BUILDERS),
        doc="Schedule drawn first: GNNPipe's chunked fill-drain, GPipe, 1F1B (PipeDream-flush), "
            "interleaved 1F1B (Megatron-LM), ZB-H1 (zero bubble), or one of PyTorch's seven "
            "(torch:...).")
    other = param.ObjectSelector(
        default="1f1b", objects=list(BUILDERS),
        doc="Schedule drawn below it, on the same time axis, for comparison.")
    stages = param.Integer(default=4, bounds=(1, 16), doc="Ranks S (pipeline stages).")
    chunks = param.Integer(default=8, bounds=(1, 64), doc="Chunks per epoch C.")
    virtual = param.Integer(
        default=2, bounds=(1, 8),
        doc="Stages per rank v (interleaved, looped and V-shaped schedules only).")
    forward = param.Number(
        default=1.0, bounds=(0.0, None), softbounds=(0.0, 5.0), step=0.1,
        doc="Seconds of one forward op (one chunk at one full stage).")
    backward = param.Number(
        default=2.0, bounds=(0.0, None), softbounds=(0.0, 5.0), step=0.1,
        doc="Seconds of one backward op (one chunk at one full stage; ZB-H1 splits it in half).")
    comm = param.Number(
        default=0.0, bounds=(0.0, None), softbounds=(0.0, 2.0), step=0.05,
        doc="Seconds of transfer on every cross-stage dependency (activation or gradient).")
    step = param.Integer(default=0, bounds=(0, None), doc="Player position (an op boundary).")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._cache: dict[tuple, Timeline | ValueError] = {}

    @classmethod
    def for_run(cls, run: Any, **params: Any) -> ScheduleExplorer:
        """Open on a run's own stages and chunks and, for a pipeline run with a timeline, its
        measured median forward/backward seconds and transfer delay."""
        config: TrainConfig | None = getattr(run, "config", None)
        values: dict[str, Any] = {}
        if config is not None and config.mode.staged:
            values["stages"] = min(max(config.stages, 1), 16)
            values["chunks"] = min(max(config.chunks, 1), 64)
        timeline = getattr(run, "timeline", None)
        try:
            costs = costs_from(timeline) if timeline is not None else None
        except ValueError:  # a graph-parallel or one-process run: no per-chunk ops
            costs = None
        if costs is not None:
            values["forward"] = _mean(costs, "forward")
            values["backward"] = _mean(costs, "backward")
            values["comm"] = costs.comm
        return cls(**{**values, **params})

    def build(self, which: str = "schedule") -> Schedule:
        """The schedule the parameters describe (``which``: ``"schedule"`` or ``"other"``)."""
        return build(getattr(self, _side(which)), self.stages, self.chunks, self.virtual)

    def _simulated(self, which: str) -> Timeline | ValueError:
        name = getattr(self, _side(which))
        key = (name, self.stages, self.chunks, self.virtual, self.forward, self.backward, self.comm)
        if key not in self._cache:
            try:
                costs = OpCosts.uniform(self.stages, self.chunks, self.forward, self.backward,
                                        comm=self.comm)
                self._cache[key] = predict(costs, self.build(which))
            except ValueError as error:  # e.g. interleaved with C not a multiple of S
                self._cache[key] = ValueError(f"{name}: {error}")
        return self._cache[key]

    def timeline(self, which: str = "schedule") -> Timeline:
        """The predicted timeline of :meth:`build` with the forward/backward/comm costs."""
        result = self._simulated(which)
        if isinstance(result, ValueError):
            raise result
        return result

    def bubble(self, which: str = "schedule") -> float:
        """Simulated idle fraction of rank time (``Timeline.bubble_fraction``)."""
        return self.timeline(which).bubble_fraction()

    def formula(self, which: str = "schedule") -> float:
        """The schedule's equal-cost textbook bubble (:func:`gnnpipe.analysis.whatif.bubble_formula`)."""
        return self._formula(which)[1]

    def _formula(self, which: str) -> tuple[str, float]:
        return bubble_formula(getattr(self, _side(which)), self.stages, self.chunks,
                              self.virtual, self.forward, self.backward)

    def times(self) -> list[float]:
        """The instants the player steps through: every op start and end of both schedules."""
        found = {0.0}
        for which in _SIDES:
            result = self._simulated(which)
            if isinstance(result, Timeline):
                found |= set(result.df["start"]) | set(result.df["end"])
        return sorted(found)

    def now(self) -> float:
        """The time of the player's position :attr:`step`."""
        times = self.times()
        return times[min(self.step, len(times) - 1)]

    def state(self, which: str = "schedule", time: float | None = None) -> pd.DataFrame:
        """Per rank at ``time`` (default :meth:`now`): the op it runs (grid label, ``.`` idle),
        that op's chunk (-1 idle) and how many chunks' activations it holds."""
        time = self.now() if time is None else time
        tl, sched = self.timeline(which), self.build(which)
        df = tl.df
        labels = pd.Series([sched.label(op) for op in sched.ops()], index=df.index)
        running = (df["start"] <= time) & (time < df["end"])
        rows = []
        for rank in range(sched.num_ranks):
            now = df[running & (df["rank"] == rank)]
            rows.append({"rank": rank, "op": labels[now.index[0]] if len(now) else ".",
                         "chunk": int(now["chunk"].iloc[0]) if len(now) else -1})
        frame = pd.DataFrame(rows)
        frame["held"] = tl.inflight_at(time).reindex(frame["rank"], fill_value=0).to_numpy()
        return frame

    def span(self) -> float:
        """The time axis both plots share: the longer makespan of the two schedules."""
        spans = [r.makespan() for r in map(self._simulated, _SIDES) if isinstance(r, Timeline)]
        return max(spans, default=1.0) or 1.0

    @param.depends(*_INPUTS, "step")
    def plot(self, which: str = "schedule") -> hv.Element:
        """The simulated timeline, one lane per rank, on the time axis both schedules share
        (:meth:`span`), with the player's instant :meth:`now` as a dashed line."""
        result = self._simulated(which)
        title = f"{getattr(self, _side(which))}, S={self.stages}, C={self.chunks}"
        if isinstance(result, ValueError):
            return hv.Text(0, 0, str(result)).opts(title=title, xaxis=None, yaxis=None)
        cursor = hv.VLine(self.now()).opts(color="black", line_dash="dashed", line_width=1.5)
        return (timeline_plot(result, title=title) * cursor).opts(xlim=(0, self.span()))

    @param.depends(*_INPUTS)
    def summary(self, which: str = "schedule") -> str:
        """Markdown: the schedule's paper, the simulated bubble beside its published formula,
        the makespan and the most chunk activations a rank holds."""
        result = self._simulated(which)
        name = getattr(self, _side(which))
        if isinstance(result, ValueError):
            return f"**{result}**"
        text, value = self._formula(which)
        formula = (f"published bubble {text} = **{value:.1%}**" if text else
                   "no closed-form bubble published for these costs")
        return (f"**{name}** — {CATALOGUE[name].paper}  \n**bubble {result.bubble_fraction():.1%}**"
                f" (simulated) · {formula} · makespan {result.makespan():.4g} s · at most "
                f"{int(result.peak_inflight().max())} chunk activations held by one rank")

    @param.depends(*_INPUTS, "step")
    def state_text(self, which: str = "schedule") -> str:
        """Markdown table of :meth:`state` at the player's instant."""
        if isinstance(self._simulated(which), ValueError):
            return ""
        st = self.state(which)
        head = ("| rank | runs | chunk | chunk activations held |\n"
                "|---|---|---|---|\n")
        body = "\n".join(f"| {r.rank} | {r.op} | {r.chunk if r.chunk >= 0 else '–'} | {r.held} |"
                         for r in st.itertuples())
        return f"{getattr(self, _side(which))} at t = {self.now():.4g} s\n\n{head}{body}"

    def _player(self) -> pn.widgets.Player:
        player = pn.widgets.Player(label="instant (an op's start or end)", start=0,
                                   end=max(len(self.times()) - 1, 1),
                                   value=min(self.step, len(self.times()) - 1), interval=400,
                                   loop_policy="once", width=380)

        def to_self(event: Any) -> None:
            self.step = int(event.new)

        def to_player(*_: Any) -> None:
            player.end = max(len(self.times()) - 1, 1)
            player.value = min(self.step, player.end)

        player.param.watch(to_self, "value")
        self.param.watch(to_player, _INPUTS)
        return player

    def _bound(self, method: Any, which: str, names: list[str]) -> Any:
        """``method(which)``, re-run by Panel whenever one of the ``names`` parameters moves."""
        return pn.bind(lambda *_: method(which), *(self.param[n] for n in names))

    def _column(self, which: str) -> pn.Column:
        moving = [*_INPUTS, "step"]
        plot = pn.pane.HoloViews(self._bound(self.plot, which, moving),
                                 sizing_mode="stretch_width", backend="bokeh", linked_axes=False)
        text = pn.pane.Markdown(self._bound(self.summary, which, _INPUTS),
                                sizing_mode="stretch_width")
        table = pn.pane.Markdown(self._bound(self.state_text, which, moving), width=330)
        return pn.Column(plot, pn.Row(text, table, sizing_mode="stretch_width"),
                         sizing_mode="stretch_width")

    def panel(self) -> pn.Column:
        """The widgets and the player in a row on top; the two schedules below, one above the
        other on one time axis, each the card's full width (legible on a 1,280-px projector and
        in a notebook cell); then what every symbol of the formulas means."""
        widgets = pn.Param(self, parameters=_INPUTS, show_name=False, default_layout=pn.FlexBox,
                           widgets={name: {"width": 170, **({"format": "0.[0000]"} if name in
                                                            ("forward", "backward", "comm")
                                                            else {})} for name in _INPUTS},
                           sizing_mode="stretch_width")
        symbols = pn.pane.Markdown(
            "**Symbols.** " + " · ".join(f"`{k}` {v}" for k, v in SYMBOLS.items()) +
            ". A dashed line marks the player's instant, the same on both timelines; "
            "compute bars fill each rank's lane, transfers (with `comm` > 0) are gaps.",
            sizing_mode="stretch_width")
        return pn.Column(pn.Row(widgets, self._player(), sizing_mode="stretch_width"),
                         self._column("schedule"), self._column("other"), symbols,
                         sizing_mode="stretch_width")


def _mean(costs: OpCosts, kind: str) -> float:
    return sum(costs.stage_mean(kind, s) for s in range(costs.stages)) / costs.stages
