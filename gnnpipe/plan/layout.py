"""Layouts: every way a job can run on ``N`` workers (a mode, its ranks' shape and the memory
options), as frozen data the planner searches over."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gnnpipe.core.kinds import Mode, Precision, TrainSchedule

__all__ = ["PLANNED_MODES", "Layout", "layouts"]

#: The modes a plan chooses among (``local`` holds a pipeline's memory in one process: never
#: the better choice on workers).
PLANNED_MODES = (Mode.SINGLE, Mode.PIPELINE, Mode.GRAPH, Mode.HYBRID)

Range = tuple[int, int]


@dataclass(frozen=True)
class Layout:
    """One way to run a job: the mode, the ranks' shape and the memory options, as
    ``gp.train`` takes them.

    Attributes:
        mode: how it trains.
        stages, ways, parts: pipeline stages (per way), pipelines side by side (``hybrid``) and
            graph partitions (``graph``); 1 where the mode has none.
        chunks: chunks per epoch (1 in ``single`` and ``graph``).
        ranges: each stage's block range (``()`` until a split is chosen; the whole model in
            ``single`` and ``graph``).
        recompute, history_dtype, wire_dtype, schedule: ``gp.train``'s options of those names.
    """

    mode: Mode
    stages: int = 1
    ways: int = 1
    parts: int = 1
    chunks: int = 1
    ranges: tuple[Range, ...] = ()
    recompute: bool = False
    history_dtype: Precision = Precision.FLOAT32
    wire_dtype: Precision = Precision.FLOAT32
    schedule: TrainSchedule = TrainSchedule.GNNPIPE

    @property
    def workers(self) -> int:
        """Dask workers it runs on (1 for ``single``, which runs in the calling process)."""
        if self.mode is Mode.GRAPH:
            return self.parts
        return self.stages * self.ways if self.mode.distributed else 1

    @property
    def compact(self) -> bool:
        """Whether it stores or sends 16-bit values (``history_dtype``, ``wire_dtype``)."""
        return Precision.FLOAT32 is not self.history_dtype or (
            self.wire_dtype is not Precision.FLOAT32)

    def describe(self) -> str:
        """A short name: ``pipeline 2 x 8``, ``graph 4 parts``, ``hybrid 2 x 2 x 8`` and the
        options that are not the defaults."""
        shape = {Mode.SINGLE: "", Mode.GRAPH: f" {self.parts} parts",
                 Mode.PIPELINE: f" {self.stages} x {self.chunks}",
                 Mode.HYBRID: f" {self.ways} x {self.stages} x {self.chunks}"}.get(self.mode, "")
        options = [self.schedule.value] if self.schedule is not TrainSchedule.GNNPIPE else []
        options += ["recompute"] if self.recompute else []
        options += [f"{self.history_dtype.value} history"] if (
            self.history_dtype is not Precision.FLOAT32) else []
        options += [f"{self.wire_dtype.value} wire"] if (
            self.wire_dtype is not Precision.FLOAT32) else []
        return f"{self.mode.value}{shape}" + (f" ({', '.join(options)})" if options else "")

    def train_options(self) -> dict[str, Any]:
        """The keyword arguments of ``gp.train`` that run this layout (but the split itself,
        which a plan passes as ``plan=``)."""
        out: dict[str, Any] = {"mode": self.mode.value}
        if self.mode.staged:
            out.update(stages=self.stages, chunks=self.chunks, recompute=self.recompute,
                       history_dtype=self.history_dtype.value, schedule=self.schedule.value)
        if self.mode is Mode.HYBRID:
            out["ways"] = self.ways
        if self.mode is Mode.GRAPH:
            out["parts"] = self.parts
        if self.mode.distributed:
            out["wire_dtype"] = self.wire_dtype.value
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values."""
        out = dataclasses.asdict(self)
        out.update(mode=self.mode.value, ranges=[list(r) for r in self.ranges],
                   history_dtype=self.history_dtype.value, wire_dtype=self.wire_dtype.value,
                   schedule=self.schedule.value)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Layout:
        """:meth:`to_dict`'s values back (``ValueError``/``KeyError`` on others)."""
        return cls(mode=Mode.parse("mode", raw["mode"]), stages=int(raw["stages"]),
                   ways=int(raw["ways"]), parts=int(raw["parts"]), chunks=int(raw["chunks"]),
                   ranges=tuple((int(a), int(b)) for a, b in raw["ranges"]),
                   recompute=bool(raw["recompute"]),
                   history_dtype=Precision.of("history_dtype", raw["history_dtype"]),
                   wire_dtype=Precision.of("wire_dtype", raw["wire_dtype"]),
                   schedule=TrainSchedule.parse("schedule", raw["schedule"]))


def layouts(workers: int, blocks: int, modes: Sequence[Mode], compact: bool | None,
            schedules: Sequence[TrainSchedule]) -> Iterator[Layout]:
    """Every layout on at most ``workers`` workers of a ``blocks``-block model in ``modes``,
    without chunks or a split (the planner chooses those): ``single``; ``pipeline`` with 2 to
    ``workers`` stages; ``graph`` with 2 to ``workers`` parts; ``hybrid`` with ``ways x
    stages <= workers``, both at least 2. Staged layouts come with and without ``recompute``
    in each of ``schedules``; 16-bit histories and wire as well unless ``compact`` is False."""
    dtypes = [Precision.FLOAT32] + ([Precision.BFLOAT16] if compact is not False else [])
    for mode in modes:
        if mode is Mode.SINGLE:
            yield Layout(Mode.SINGLE, ranges=((0, blocks),))
        elif mode is Mode.GRAPH:
            for parts, wire in itertools.product(range(2, workers + 1), dtypes):
                yield Layout(Mode.GRAPH, parts=parts, ranges=((0, blocks),), wire_dtype=wire)
        elif mode in (Mode.PIPELINE, Mode.HYBRID):
            yield from _staged(mode, workers, blocks, dtypes, schedules)


def _staged(mode: Mode, workers: int, blocks: int, dtypes: list[Precision],
            schedules: Sequence[TrainSchedule]) -> Iterator[Layout]:
    shapes = ([(1, s) for s in range(2, min(workers, blocks) + 1)] if mode is Mode.PIPELINE else
              [(w, s) for w in range(2, workers // 2 + 1)
               for s in range(2, min(workers // w, blocks) + 1)])
    orders = schedules if mode is Mode.PIPELINE else [TrainSchedule.GNNPIPE]  # hybrid: fill-drain
    for (ways, stages), order, recompute, history, wire in itertools.product(
            shapes, orders, (False, True), dtypes, dtypes):
        yield Layout(mode, stages=stages, ways=ways, recompute=recompute, history_dtype=history,
                     wire_dtype=wire, schedule=order)
