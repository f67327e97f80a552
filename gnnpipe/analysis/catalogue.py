"""Every schedule gnnpipe can draw, by name: gnnpipe's five built-ins and PyTorch's seven, each
with the paper it comes from and its published bubble for equal op costs where one exists.

The symbols every formula uses (:data:`SYMBOLS`): ``S`` ranks (pipeline stages), ``C`` chunks
per epoch, ``v`` stages per rank, ``T_F``, ``T_B``, ``T_W`` the seconds of a forward, a backward
(its input-gradient half where the backward is split) and a weight-gradient op. The bubble is
the share of rank-time a rank is not computing: ``1 − busy ÷ (ranks × makespan)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gnnpipe import schedule as schedules
from gnnpipe.schedule import Schedule

__all__ = ["BUILTIN", "CATALOGUE", "SYMBOLS", "Entry", "bubble_formula", "build"]

#: What each symbol of a formula means.
SYMBOLS: dict[str, str] = {
    "S": "ranks (pipeline stages)",
    "C": "chunks per epoch (the micro-batches of sequence-model pipelines)",
    "v": "stages per rank (interleaved, looped and V-shaped schedules)",
    "T_F": "seconds of one forward op",
    "T_B": "seconds of one backward op (its input-gradient half where it is split)",
    "T_W": "seconds of one weight-gradient op (split backwards only)",
    "bubble": "share of rank-time not computing: 1 − busy ÷ (ranks × makespan)",
}

_FILL_DRAIN = "(S−1)/(C+S−1)"
_INTERLEAVED = "(S−1)/(v·C+S−1)"


@dataclass(frozen=True)
class Entry:
    """A schedule the explorer offers: how to build it, where it comes from, its bubble."""

    build: Callable[[int, int, int, bool], Schedule]
    paper: str
    formula: str = ""
    #: True: several stages per rank (``virtual`` applies); False: one
    virtual: bool = False

    def bubble(self, stages: int, chunks: int, virtual: int, forward: float,
               backward: float) -> float:
        """The formula's value (NaN where no closed form is published)."""
        s, c, v = stages, chunks, virtual
        if self.formula == _FILL_DRAIN:
            return (s - 1) / (c + s - 1)
        if self.formula == _INTERLEAVED:
            return (s - 1) / (v * c + s - 1)
        if self.formula.startswith("(S−1)(T_F+T_B−T_W)"):  # ZB-H1 with T_B = T_W = backward / 2
            idle = (s - 1) * forward
            total = c * (forward + backward) + idle
            return idle / total if total else 0.0
        return math.nan


def _torch(name: str, several: bool) -> Callable[[int, int, int, bool], Schedule]:
    return lambda s, c, v, step: schedules.from_torch(name, s, c, v if several else 1)


#: gnnpipe's own schedules, the ones a run's measured costs can be replayed under (what-if).
BUILTIN = ("gnnpipe", "gpipe", "1f1b", "interleaved", "zb-h1")
_ZB = "(S−1)(T_F+T_B−T_W)/(C(T_F+T_B+T_W)+(S−1)(T_F+T_B−T_W))"
CATALOGUE: dict[str, Entry] = {
    "gnnpipe": Entry(lambda s, c, v, step: schedules.gnnpipe(s, c, step=step),
                     "GNNPipe: Chen et al., 2023 (fill-drain over graph chunks)", _FILL_DRAIN),
    "gpipe": Entry(lambda s, c, v, step: schedules.gpipe(s, c, step=step),
                   "GPipe: Huang et al., NeurIPS 2019", _FILL_DRAIN),
    "1f1b": Entry(lambda s, c, v, step: schedules.one_f_one_b(s, c, step=step),
                  "PipeDream-flush 1F1B: Narayanan et al., ICML 2021", _FILL_DRAIN),
    "interleaved": Entry(lambda s, c, v, step: schedules.interleaved_1f1b(s, c, v, step=step),
                         "interleaved 1F1B (Megatron-LM): Narayanan et al., SC 2021",
                         _INTERLEAVED, virtual=True),
    "zb-h1": Entry(lambda s, c, v, step: schedules.zb_h1(s, c, step=step),
                   "ZB-H1: Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024", _ZB),
    "torch:GPipe": Entry(_torch("GPipe", False), "PyTorch ScheduleGPipe (GPipe, Huang et al. "
                         "2019)", _FILL_DRAIN),
    "torch:1F1B": Entry(_torch("1F1B", False), "PyTorch Schedule1F1B (Narayanan et al. 2021)",
                        _FILL_DRAIN),
    "torch:Interleaved1F1B": Entry(_torch("Interleaved1F1B", True), "PyTorch "
                                   "ScheduleInterleaved1F1B (Narayanan et al., SC 2021)",
                                   _INTERLEAVED, virtual=True),
    "torch:LoopedBFS": Entry(_torch("LoopedBFS", True), "PyTorch ScheduleLoopedBFS "
                             "(breadth-first: Lamy-Poirier, 2023)", _INTERLEAVED, virtual=True),
    "torch:InterleavedZeroBubble": Entry(_torch("InterleavedZeroBubble", True), "PyTorch "
                                         "ScheduleInterleavedZeroBubble (Qi et al., ICLR 2024)",
                                         virtual=True),
    "torch:ZBVZeroBubble": Entry(_torch("ZBVZeroBubble", True), "PyTorch ScheduleZBVZeroBubble "
                                 "(ZB-V: Qi et al., ICLR 2024)", virtual=True),
    "torch:DualPipeV": Entry(_torch("DualPipeV", True), "PyTorch ScheduleDualPipeV (DualPipe: "
                             "DeepSeek-AI, DeepSeek-V3 report, 2024)", virtual=True),
}


def build(name: str, stages: int, chunks: int, virtual: int = 2, step: bool = False) -> Schedule:
    """The schedule ``name`` (a key of :data:`CATALOGUE`) for ``stages`` ranks and ``chunks``
    (``virtual`` stages per rank where it holds several; PyTorch's have no ``step`` op)."""
    if name not in CATALOGUE:
        raise ValueError(f"name: expected one of {list(CATALOGUE)}, got {name!r}")
    return CATALOGUE[name].build(stages, chunks, virtual, step)


def bubble_formula(name: str, stages: int, chunks: int, virtual: int = 2,
                   forward: float = 1.0, backward: float = 1.0) -> tuple[str, float]:
    """``(formula, value)``: the published bubble of schedule ``name`` with equal op costs and
    no transfer delays (ZB-H1 with ``T_B = T_W = backward / 2``); ``("", nan)`` where none is
    published for these costs."""
    if name not in CATALOGUE:
        raise ValueError(f"name: expected one of {list(CATALOGUE)}, got {name!r}")
    entry = CATALOGUE[name]
    return entry.formula, entry.bubble(stages, chunks, virtual, forward, backward)
