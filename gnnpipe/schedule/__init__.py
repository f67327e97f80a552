"""Pipeline schedules as frozen data, their simulator and their step × rank grids.

- :mod:`~gnnpipe.schedule.simulator`: :func:`simulate`, a schedule with op costs to a predicted
  :class:`~gnnpipe.core.timeline.Timeline` (the bottom of this package);
- :mod:`~gnnpipe.schedule.ops`: :class:`Op` and :class:`Schedule`, which prints as the grid
  a unit-cost simulation gives;
- :mod:`~gnnpipe.schedule.builders`: GNNPipe's fill-drain, GPipe, 1F1B, interleaved 1F1B and
  ZB-H1;
- :mod:`~gnnpipe.schedule.pytorch`: :func:`from_torch`, any of PyTorch's own schedules (or a CSV
  of actions) as a :class:`Schedule`.
"""

from __future__ import annotations

from gnnpipe.schedule.builders import gnnpipe, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
from gnnpipe.schedule.ops import LABELS, OP_KINDS, Op, OpKey, Schedule, backward_op, forward_op
from gnnpipe.schedule.pytorch import TORCH_SCHEDULES, from_torch
from gnnpipe.schedule.simulator import Costs, simulate

__all__ = ["LABELS", "OP_KINDS", "TORCH_SCHEDULES", "Costs", "Op", "OpKey", "Schedule",
           "backward_op", "forward_op", "from_torch", "gnnpipe", "gpipe", "interleaved_1f1b",
           "one_f_one_b", "simulate", "zb_h1"]
