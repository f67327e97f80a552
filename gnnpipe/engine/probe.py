"""What a stack's blocks aggregate, found by running them once on a 4-node ring.

Each ``ctx.aggregate`` or ``ctx.message_passing`` call is an :class:`AggregationCall`: the width
of the rows it reads from other chunks or partitions, and whether they need a gradient back. The
communication formulas (:mod:`gnnpipe.analysis.volume`) count these, so a user's block that aggregates
something narrower or wider than its output is counted as it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.single import FullGraphContext
from gnnpipe.nn import Block

if TYPE_CHECKING:
    from gnnpipe.nn.stack import BlockList

__all__ = ["AggregationCall", "probe_calls"]


@dataclass(frozen=True)
class AggregationCall:
    """One aggregation: input ``width``, whether the input ``needs_grad``, and whether it is a
    PyG ``message_passing`` call (else the built-in ``Â @ h``)."""

    width: int
    needs_grad: bool
    message_passing: bool


class _Recorder:
    """A full-graph context (eval mode) that records its aggregation calls."""

    def __init__(self, ctx: FullGraphContext) -> None:
        self.ctx, self.training = ctx, False
        self.calls: list[AggregationCall] = []

    def aggregate(self, h: Tensor, key: int) -> Tensor:
        self.calls.append(AggregationCall(h.size(1), h.requires_grad, False))
        return self.ctx.aggregate(h, key)

    def message_passing(self, module: nn.Module, h: Tensor, key: int) -> Tensor:
        self.calls.append(AggregationCall(h.size(1), h.requires_grad, True))
        return self.ctx.message_passing(module, h, key)

    def dropout(self, h: Tensor, p: float, key: int) -> Tensor:
        return h


def probe_calls(blocks: Sequence[Block] | BlockList, in_dim: int,
                set_dims: bool = False) -> list[list[AggregationCall]]:
    """Per block, its aggregation calls on a 4-node ring with ``in_dim`` random features.

    With ``set_dims`` each block's ``in_dim`` and ``out_dim`` are set from what it reads and
    returns (for blocks made from PyG parts, which do not know them)."""
    param = next((p for b in blocks for p in b.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    ring = torch.tensor([[0, 1, 2, 3, 1, 2, 3, 0], [1, 2, 3, 0, 0, 1, 2, 3]], device=device)
    ctx = _Recorder(FullGraphContext(normalized_adjacency(ring, 4, "mean")))
    h = torch.randn(4, in_dim, generator=torch.Generator().manual_seed(0)).to(device)
    h0: Tensor | None = None
    modes = [b.training for b in blocks]
    calls = []
    try:
        with torch.enable_grad():
            for block in blocks:
                ctx.calls = []
                if set_dims:
                    block.in_dim = h.size(1)
                h, out = block.eval()(h, h0, ctx)
                h0 = out if out is not None or getattr(block, "sets_h0", False) else h0
                if set_dims:
                    block.out_dim = h.size(1)
                calls.append(ctx.calls)
    finally:
        for block, mode in zip(blocks, modes):
            block.train(mode)
    return calls
