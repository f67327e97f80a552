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

__all__ = ["BUILTIN", "CATALOGUE", "SYMBOLS", "Bubble", "Entry", "bubble_formula", "build"]

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

def _fill_drain(s: int, c: int, v: int, forward: float, backward: float) -> float:
    return (s - 1) / (c + s - 1)


def _interleaved(s: int, c: int, v: int, forward: float, backward: float) -> float:
    return (s - 1) / (v * c + s - 1)


def _zb_h1(s: int, c: int, v: int, forward: float, backward: float) -> float:
    """With ``T_B = T_W = backward / 2``: ``(S−1)·T_F`` idle per rank."""
    idle = (s - 1) * forward
    total = c * (forward + backward) + idle
    return idle / total if total else 0.0


#: A published bubble: its text and its value ``(S, C, v, T_F, T_B + T_W) -> share``.
Bubble = tuple[str, Callable[[int, int, int, float, float], float]]
_FILL_DRAIN: Bubble = ("(S−1)/(C+S−1)", _fill_drain)
_INTERLEAVED: Bubble = ("(S−1)/(v·C+S−1)", _interleaved)
_ZB: Bubble = ("(S−1)(T_F+T_B−T_W)/(C(T_F+T_B+T_W)+(S−1)(T_F+T_B−T_W))", _zb_h1)


@dataclass(frozen=True)
class Entry:
    """A schedule the explorer offers: how to build it, where it comes from, and its published
    bubble for equal op costs (``None``: no closed form for these costs)."""

    build: Callable[[int, int, int, bool], Schedule]
    paper: str
    bubble: Bubble | None = None


def _torch(name: str, several: bool) -> Callable[[int, int, int, bool], Schedule]:
    return lambda s, c, v, step: schedules.from_torch(name, s, c, v if several else 1)


#: gnnpipe's own schedules, the ones a run's measured costs can be replayed under (what-if).
BUILTIN = ("gnnpipe", "gpipe", "1f1b", "interleaved", "zb-h1")
CATALOGUE: dict[str, Entry] = {
    "gnnpipe": Entry(lambda s, c, v, step: schedules.gnnpipe(s, c, step=step),
                     "GNNPipe: Chen et al., 2023 (fill-drain over graph chunks)", _FILL_DRAIN),
    "gpipe": Entry(lambda s, c, v, step: schedules.gpipe(s, c, step=step),
                   "GPipe: Huang et al., NeurIPS 2019", _FILL_DRAIN),
    "1f1b": Entry(lambda s, c, v, step: schedules.one_f_one_b(s, c, step=step),
                  "PipeDream-flush 1F1B: Narayanan et al., ICML 2021", _FILL_DRAIN),
    "interleaved": Entry(lambda s, c, v, step: schedules.interleaved_1f1b(s, c, v, step=step),
                         "interleaved 1F1B (Megatron-LM): Narayanan et al., SC 2021",
                         _INTERLEAVED),
    "zb-h1": Entry(lambda s, c, v, step: schedules.zb_h1(s, c, step=step),
                   "ZB-H1: Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024", _ZB),
    "torch:GPipe": Entry(_torch("GPipe", False), "PyTorch ScheduleGPipe (GPipe, Huang et al. "
                         "2019)", _FILL_DRAIN),
    "torch:1F1B": Entry(_torch("1F1B", False), "PyTorch Schedule1F1B (Narayanan et al. 2021)",
                        _FILL_DRAIN),
    "torch:Interleaved1F1B": Entry(_torch("Interleaved1F1B", True), "PyTorch "
                                   "ScheduleInterleaved1F1B (Narayanan et al., SC 2021)",
                                   _INTERLEAVED),
    "torch:LoopedBFS": Entry(_torch("LoopedBFS", True), "PyTorch ScheduleLoopedBFS "
                             "(breadth-first: Lamy-Poirier, 2023)", _INTERLEAVED),
    "torch:InterleavedZeroBubble": Entry(_torch("InterleavedZeroBubble", True), "PyTorch "
                                         "ScheduleInterleavedZeroBubble (Qi et al., ICLR 2024)"),
    "torch:ZBVZeroBubble": Entry(_torch("ZBVZeroBubble", True), "PyTorch ScheduleZBVZeroBubble "
                                 "(ZB-V: Qi et al., ICLR 2024)"),
    "torch:DualPipeV": Entry(_torch("DualPipeV", True), "PyTorch ScheduleDualPipeV (DualPipe: "
                             "DeepSeek-AI, DeepSeek-V3 report, 2024)"),
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
    bubble = CATALOGUE[name].bubble
    if bubble is None:
        return "", math.nan
    text, value = bubble
    return text, value(stages, chunks, virtual, forward, backward)
