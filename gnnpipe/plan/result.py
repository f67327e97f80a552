"""`Plan`: the layout ``gp.plan`` chose, what it should cost, and every candidate it weighed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gnnpipe.core.kinds import Mode
from gnnpipe.core.prediction import CANDIDATE_COLUMNS, Prediction
from gnnpipe.core.timeline import Timeline
from gnnpipe.core.units import DEFAULT_BANDWIDTH, format_bytes
from gnnpipe.plan.costs import DEFAULT_LATENCY, Network, staged_timeline
from gnnpipe.plan.layout import Layout
from gnnpipe.plan.profile import BlockCost, Profile

__all__ = ["PLAN_FORMAT", "Plan"]

#: The ``format`` of a plan written by :meth:`Plan.to_json` (``/1``: pipeline-only plans, read
#: as pipeline layouts).
PLAN_FORMAT = "gnnpipe.plan/2"
_FORMAT_1 = "gnnpipe.plan/1"


@dataclass(frozen=True, repr=False)
class Plan:
    """How to run a job: the chosen :class:`~gnnpipe.plan.layout.Layout`, its predicted
    epoch, memory and bytes, and the candidates it beat (``gp.train(model, data, plan=plan)``
    runs it in its mode).

    Attributes:
        layout: the chosen mode, shape, split, chunks and options.
        epoch_time: predicted seconds per training epoch.
        peak_bytes: predicted peak memory of each rank (``gp.estimate_memory``'s model).
        comm_bytes: predicted bytes per epoch (``gp.comm_volume``).
        stage_times: predicted busy seconds of each stage (staged modes; else empty).
        timeline: the simulated epoch (staged modes; else empty).
        profile: the measured block costs the plan came from (reusable: ``profile=``).
        candidates: one row per layout weighed, best first (:meth:`table`).
        workers: the workers it was planned for.
        memory_limit, bandwidth, latency: what it was planned under.
        headroom: the share of ``memory_limit`` the plan kept free (every rank's estimate is at
            most ``(1 - headroom) × memory_limit``).
        made_for: what the plan was made for, as its maker records it (the command line keeps
            ``model``, ``layers``, ``hidden`` and ``dataset`` here); saved with :meth:`to_json`.
        seconds: what planning took, by phase (``memory_check``: the refusal of a limit no
            layout meets, ``profile``, ``search``, and ``swap_wait`` where a ``graph`` layout
            contending for the pick ran briefly to measure it; the profile's 0 when one was
            reused).
    """

    layout: Layout
    epoch_time: float
    peak_bytes: tuple[int, ...]
    comm_bytes: int
    profile: Profile
    stage_times: tuple[float, ...] = ()
    timeline: Timeline = field(default_factory=Timeline)
    candidates: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=list(CANDIDATE_COLUMNS)))
    workers: int = 1
    memory_limit: int | None = None
    headroom: float = 0.0
    bandwidth: float = DEFAULT_BANDWIDTH
    latency: float = DEFAULT_LATENCY
    made_for: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ the layout
    @property
    def mode(self) -> Mode:
        """The chosen mode."""
        return self.layout.mode

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Each stage's block range (the whole model in ``single`` and ``graph``)."""
        return self.layout.ranges

    @property
    def chunks(self) -> int:
        return self.layout.chunks

    @property
    def memory(self) -> tuple[int, ...]:
        """Predicted peak bytes of each rank (as :attr:`peak_bytes`)."""
        return self.peak_bytes

    @property
    def layers(self) -> tuple[int, ...]:
        """GNN (aggregating) layers in each stage."""
        return tuple(sum(c.aggregates for c in self.profile.blocks[a:b]) for a, b in self.ranges)

    @property
    def prediction(self) -> Prediction:
        """What a run trained from this plan carries (``run.prediction``)."""
        return Prediction(self.layout.describe(), self.epoch_time, self.peak_bytes,
                          self.comm_bytes, self.candidates, self.memory_limit)

    def predict(self, ranges: Sequence[tuple[int, int]] | None = None,
                chunks: int | None = None) -> Timeline:
        """Simulated epoch of this plan's staged layout with other stage ranges (e.g. the
        uniform split) or another chunk count, with this plan's costs."""
        if not self.layout.mode.staged:
            raise ValueError(f"plan: a {self.mode.value} plan has no stages to simulate")
        layout = dataclasses.replace(self.layout, ranges=tuple(ranges or self.ranges),
                                     chunks=chunks or self.chunks)
        return staged_timeline(self.profile, layout, layout.ranges,
                               Network(self.bandwidth, self.latency))

    def table(self) -> pd.DataFrame:
        """Every layout weighed, best first: its mode and shape, predicted ``epoch_time``,
        ``peak_bytes`` (its largest rank's), ``comm_bytes``, whether it ``fits`` the memory
        limit, which one was ``chosen`` and the ``reason`` each other one lost."""
        return self.candidates.copy()

    def candidate(self, index: int) -> Plan:
        """The plan of row ``index`` of :meth:`table` (0 is this plan's own layout): to train
        the runner-up, ``gp.train(model, data, plan=plan.candidate(1))``."""
        row = self.candidates.iloc[index]
        layout = Layout.from_dict({k: row[k] for k in (
            "mode", "stages", "ways", "parts", "chunks", "ranges", "recompute", "history_dtype",
            "wire_dtype", "schedule")})
        timeline = (staged_timeline(self.profile, layout, layout.ranges,
                                    Network(self.bandwidth, self.latency))
                    if layout.mode.staged else Timeline())
        return dataclasses.replace(
            self, layout=layout, epoch_time=float(row["epoch_time"]),
            peak_bytes=tuple(int(b) for b in row["rank_peak_bytes"]),
            comm_bytes=int(row["comm_bytes"]), stage_times=(), timeline=timeline)

    def stages_table(self) -> pd.DataFrame:
        """One row per stage (or rank): blocks, GNN layers, predicted busy seconds, memory."""
        times = self.stage_times or (self.epoch_time,) * len(self.ranges)
        ranks = len(self.peak_bytes)
        return pd.DataFrame({
            "stage": range(len(self.ranges)),
            "blocks": [f"{a}-{b - 1}" for a, b in self.ranges],
            "layers": self.layers,
            "predicted_s": times,
            "memory": [format_bytes(self.peak_bytes[min(s, ranks - 1)])
                       for s in range(len(self.ranges))],
        }).set_index("stage")

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: everything but the simulated timeline, which
        :meth:`from_dict` simulates again from the profile."""
        return {
            "format": PLAN_FORMAT, "made_for": dict(self.made_for),
            "layout": self.layout.to_dict(), "epoch_time": self.epoch_time,
            "peak_bytes": list(self.peak_bytes), "comm_bytes": self.comm_bytes,
            "stage_times": list(self.stage_times), "workers": self.workers,
            "memory_limit": self.memory_limit, "headroom": self.headroom,
            "bandwidth": self.bandwidth,
            "latency": self.latency, "profile": _profile_dict(self.profile),
            "candidates": self.candidates.to_dict("records"), "seconds": dict(self.seconds),
        }

    @classmethod
    def from_dict(cls, values: Any) -> Plan:
        """The plan :meth:`to_dict` described; ``ValueError`` if ``values`` is not one."""
        fmt = values.get("format") if isinstance(values, dict) else None
        if fmt not in (PLAN_FORMAT, _FORMAT_1):
            raise ValueError(f"plan: expected a gnnpipe plan (written by Plan.to_json or "
                             f"'gnnpipe plan --out'), got {type(values).__name__} without "
                             f"format {PLAN_FORMAT!r}")
        try:
            profile = _profile_of(values["profile"])
            layout = (Layout.from_dict(values["layout"]) if fmt == PLAN_FORMAT else Layout(
                Mode.PIPELINE, stages=len(values["ranges"]), chunks=int(values["chunks"]),
                ranges=tuple((int(a), int(b)) for a, b in values["ranges"])))
            bandwidth, latency = float(values["bandwidth"]), float(values["latency"])
            timeline = (staged_timeline(profile, layout, layout.ranges,
                                        Network(bandwidth, latency))
                        if layout.mode.staged else Timeline())
            peaks = values.get("peak_bytes", values.get("memory"))
            return cls(
                layout=layout, epoch_time=float(values["epoch_time"]),
                peak_bytes=tuple(int(b) for b in peaks),
                comm_bytes=int(values.get("comm_bytes", 0)), profile=profile,
                stage_times=tuple(values.get("stage_times", ())), timeline=timeline,
                candidates=pd.DataFrame(values.get("candidates", []) if fmt == PLAN_FORMAT
                                        else [], columns=list(CANDIDATE_COLUMNS)),
                workers=int(values.get("workers", layout.workers)),
                memory_limit=values["memory_limit"],
                headroom=float(values.get("headroom", 0.0)), bandwidth=bandwidth, latency=latency,
                made_for=dict(values["made_for"]), seconds=dict(values.get("seconds", {})))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"plan: a damaged gnnpipe plan ({type(err).__name__}: {err})") from None

    def to_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``; returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, default=_plain))
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> Plan:
        """Read a plan written by :meth:`to_json`; ``ValueError`` naming the file otherwise."""
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"plan: cannot read a plan from {path} ({err})") from None
        return cls.from_dict(values)

    def __repr__(self) -> str:
        limit = "none" if self.memory_limit is None else format_bytes(self.memory_limit)
        if self.memory_limit is not None and self.headroom:
            limit += f", {self.headroom:.0%} kept free"
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        head = (f"Plan: {self.layout.describe()} on {workers}, predicted epoch "
                f"{self.epoch_time:.4g} s, peak {format_bytes(max(self.peak_bytes))} per rank, "
                f"{format_bytes(self.comm_bytes)} sent per epoch (memory limit {limit})")
        return head + "\n" + self.stages_table().to_string(float_format=lambda v: f"{v:.4g}")


def _plain(value: Any) -> Any:
    """JSON for the numpy scalars a DataFrame's records hold."""
    return value.item() if hasattr(value, "item") else str(value)


def _profile_dict(profile: Profile) -> dict[str, Any]:
    return {**dataclasses.asdict(profile),
            "blocks": [dataclasses.asdict(b) for b in profile.blocks],
            "chunk_counts": list(profile.chunk_counts),
            "boundary_bytes": list(profile.boundary_bytes)}


def _profile_of(raw: dict[str, Any]) -> Profile:
    return Profile(blocks=tuple(BlockCost(**b) for b in raw["blocks"]),
                   num_nodes=raw["num_nodes"], chunk_counts=tuple(raw["chunk_counts"]),
                   boundary_bytes=tuple(raw["boundary_bytes"]), seconds=raw["seconds"],
                   concurrent=raw.get("concurrent", 1), cores=raw.get("cores", 0),
                   threads=raw.get("threads", 1), latency=raw.get("latency", 0.0),
                   bandwidth=raw.get("bandwidth", 0.0), swap_wait=raw.get("swap_wait"))
