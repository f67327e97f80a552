"""The built-in deep GNNs: GCN, GraphSAGE, GCNII and ResGCN+ blocks and their stacks."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnpipe.core.kinds import BlockKind
from gnnpipe.nn.stack import Block, Context, LayerStack

__all__ = ["MODELS", "Dense", "GCNIILayer", "GCNLayer", "ResGCNPlusLayer", "SAGELayer", "build",
           "gcn", "gcnii", "resgcn_plus", "sage"]

#: An inference forward updates a graph-wide tensor in row blocks of at most this many bytes,
#: and at least this many blocks (so its temporaries are a small share at every size).
INFERENCE_BLOCK_BYTES, INFERENCE_BLOCKS = 1 << 21, 16


class Dense(Block):
    """``act(W dropout(h) + b)``: input projection or classifier. Sets ``h0`` when asked (GCNII)."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float, act: bool, kind: BlockKind,
                 sets_h0: bool = False, norm_first: bool = False) -> None:
        super().__init__()
        self.kind, self.in_dim, self.out_dim, self.p, self.act = kind, in_dim, out_dim, dropout, act
        self.sets_h0 = sets_h0
        self.norm = nn.LayerNorm(in_dim) if norm_first else None
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Context) -> tuple[Tensor, Tensor | None]:
        if self.norm is not None:  # ResGCN+ closes with norm -> relu -> dropout -> linear
            h = F.relu(self.norm(h))
        h = self.lin(ctx.dropout(h, self.p, self.key))
        if self.act:
            h = F.relu(h)
        return h, (h if self.sets_h0 else h0)


class GCNLayer(Block):
    """GCN: ``act(Â (dropout(h) W) + b)`` (transform first, so buffers hold the narrower width)."""

    aggregates = True

    def __init__(self, in_dim: int, out_dim: int, dropout: float, act: bool) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.p, self.act = in_dim, out_dim, dropout, act
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Context) -> tuple[Tensor, Tensor | None]:
        h = ctx.aggregate(self.lin(ctx.dropout(h, self.p, self.key)), self.key) + self.bias
        return (F.relu(h) if self.act else h), h0


class SAGELayer(Block):
    """GraphSAGE (mean): ``act(W_s h + mean_N(h W_n) + b)``, aggregating after the transform."""

    aggregates = True

    def __init__(self, in_dim: int, out_dim: int, dropout: float, act: bool) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.p, self.act = in_dim, out_dim, dropout, act
        self.lin_self = nn.Linear(in_dim, out_dim)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Context) -> tuple[Tensor, Tensor | None]:
        h = ctx.dropout(h, self.p, self.key)
        h = self.lin_self(h) + ctx.aggregate(self.lin_neigh(h), self.key)
        return (F.relu(h) if self.act else h), h0


class GCNIILayer(Block):
    """GCNII (Chen et al. 2020), as PyG's ``GCN2Conv`` with shared weights, then ReLU.

    ``z = (1-α) Â dropout(h) + α h0``; ``h' = relu((1-β) z + β z W)`` with ``β = log(θ/l + 1)``.
    """

    aggregates = True
    carries_h0 = True

    def __init__(self, dim: int, alpha: float, theta: float, layer: int, dropout: float) -> None:
        super().__init__()
        self.in_dim = self.out_dim = dim
        self.p, self.alpha = dropout, alpha
        self.beta = math.log(theta / layer + 1.0)
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Context) -> tuple[Tensor, Tensor | None]:
        assert h0 is not None, "GCNIILayer reads h0 (carries_h0=True)"
        if not ctx.training and not torch.is_grad_enabled():
            return self._infer(ctx.aggregate(h, self.key), h0), h0
        z = (1.0 - self.alpha) * ctx.aggregate(ctx.dropout(h, self.p, self.key), self.key)
        z = z + self.alpha * h0
        out = _GCNIIUpdate.apply(z, self.weight, self.beta)
        assert isinstance(out, Tensor)
        return out, h0

    def _infer(self, agg: Tensor, h0: Tensor) -> Tensor:
        """Inference (no dropout, no autograd) written over ``Â h`` (outside training it is the
        block's own: :class:`~gnnpipe.nn.stack.Context`), row block by row block: one
        graph-wide tensor besides ``h`` and ``h0``, where the training forward holds three at
        once. Each row block takes the training forward's elementwise steps."""
        n = agg.size(0)
        rows = max(1, min(INFERENCE_BLOCK_BYTES // max(agg.size(1) * agg.element_size(), 1),
                          -(-n // INFERENCE_BLOCKS)))
        for lo in range(0, n, rows):
            z = (1.0 - self.alpha) * agg[lo:lo + rows]
            z = z + self.alpha * h0[lo:lo + rows]
            agg[lo:lo + rows] = torch.addmm(z, z, self.weight, beta=1.0 - self.beta,
                                            alpha=self.beta).relu_()
        return agg


class _GCNIIUpdate(torch.autograd.Function):
    """``relu((1-β) z + β z W)`` keeping ``z`` and the ReLU's sign (one byte a value) for the
    backward, where ``addmm`` then ``relu`` would keep ``z`` and the float output: a quarter less
    of what a GCNII layer keeps per row."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, weight: Tensor, beta: float) -> Tensor:
        out = torch.addmm(z, z, weight, beta=1.0 - beta, alpha=beta).relu_()
        ctx.beta = beta
        ctx.save_for_backward(z, weight, out > 0)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        z, weight, positive = ctx.saved_tensors
        g = grad * positive
        grad_z = torch.addmm(g, g, weight.t(), beta=1.0 - ctx.beta, alpha=ctx.beta)
        return grad_z, (z.t() @ g).mul_(ctx.beta), None


class ResGCNPlusLayer(Block):
    """DeeperGCN's pre-activation residual block (res+): ``h + conv(dropout(relu(LN(h))))``.

    The conv is a mean-aggregating GCN; LayerNorm (row-wise) keeps chunked training exact where
    BatchNorm's statistics would depend on the chunk.
    """

    aggregates = True

    def __init__(self, dim: int, dropout: float, first: bool) -> None:
        super().__init__()
        self.in_dim = self.out_dim = dim
        self.p, self.first = dropout, first
        self.norm = nn.LayerNorm(dim)
        self.lin = nn.Linear(dim, dim)

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Context) -> tuple[Tensor, Tensor | None]:
        z = h if self.first else ctx.dropout(F.relu(self.norm(h)), self.p, self.key)
        return h + ctx.aggregate(self.lin(z), self.key), h0


# --------------------------------------------------------------------------- model families
def _check(layers: int, dims: dict[str, int], dropout: float) -> None:
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= 128:
        raise ValueError(f"layers: expected an integer from 1 to 128, got {layers!r}")
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")


def _widths(in_dim: int, hidden: int, out_dim: int, layers: int) -> list[tuple[int, int]]:
    dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
    return list(itertools.pairwise(dims))


def gcn(in_dim: int, hidden: int = 64, out_dim: int = 2, layers: int = 2,
        dropout: float = 0.5) -> LayerStack:
    """Kipf & Welling GCN with ``layers`` graph convolutions (the first maps ``in_dim``, the last
    ``out_dim``), ReLU and dropout between them."""
    _check(layers, {"in_dim": in_dim, "hidden": hidden, "out_dim": out_dim}, dropout)
    blocks = [GCNLayer(i, o, dropout, act=k < layers - 1)
              for k, (i, o) in enumerate(_widths(in_dim, hidden, out_dim, layers))]
    return LayerStack(blocks, norm="sym", name="gcn")


def sage(in_dim: int, hidden: int = 64, out_dim: int = 2, layers: int = 2,
         dropout: float = 0.5) -> LayerStack:
    """GraphSAGE with mean aggregation, ``layers`` SAGE convolutions."""
    _check(layers, {"in_dim": in_dim, "hidden": hidden, "out_dim": out_dim}, dropout)
    blocks = [SAGELayer(i, o, dropout, act=k < layers - 1)
              for k, (i, o) in enumerate(_widths(in_dim, hidden, out_dim, layers))]
    return LayerStack(blocks, norm="mean", name="sage")


def gcnii(in_dim: int, hidden: int = 64, out_dim: int = 2, layers: int = 32, alpha: float = 0.1,
          theta: float = 0.5, dropout: float = 0.6) -> LayerStack:
    """GCNII: input projection (sets ``h0``), ``layers`` GCNII layers, linear classifier."""
    _check(layers, {"in_dim": in_dim, "hidden": hidden, "out_dim": out_dim}, dropout)
    blocks: list[Block] = [Dense(in_dim, hidden, dropout, act=True, kind=BlockKind.INPUT,
                                 sets_h0=True)]
    blocks += [GCNIILayer(hidden, alpha, theta, layer=k + 1, dropout=dropout) for k in range(layers)]
    blocks.append(Dense(hidden, out_dim, dropout, act=False, kind=BlockKind.OUTPUT))
    return LayerStack(blocks, norm="sym", name="gcnii")


def resgcn_plus(in_dim: int, hidden: int = 64, out_dim: int = 2, layers: int = 32,
                dropout: float = 0.5) -> LayerStack:
    """ResGCN+ (DeeperGCN, res+): input projection, ``layers`` residual blocks, norm-relu-linear head."""
    _check(layers, {"in_dim": in_dim, "hidden": hidden, "out_dim": out_dim}, dropout)
    blocks: list[Block] = [Dense(in_dim, hidden, 0.0, act=False, kind=BlockKind.INPUT)]
    blocks += [ResGCNPlusLayer(hidden, dropout, first=k == 0) for k in range(layers)]
    blocks.append(Dense(hidden, out_dim, dropout, act=False, kind=BlockKind.OUTPUT, norm_first=True))
    return LayerStack(blocks, norm="mean", name="resgcn_plus")


MODELS: dict[str, Callable[..., LayerStack]] = {
    "gcn": gcn, "sage": sage, "gcnii": gcnii, "resgcn_plus": resgcn_plus,
}


def build(name: str, in_dim: int, out_dim: int, layers: int, hidden: int = 64,
          dropout: float | None = None, **kwargs: float) -> LayerStack:
    """Build a model family by name (``gcn``, ``sage``, ``gcnii``, ``resgcn_plus``)."""
    if name not in MODELS:
        raise ValueError(f"model: unknown model {name!r}; expected one of {sorted(MODELS)}")
    if dropout is not None:
        kwargs["dropout"] = dropout
    return MODELS[name](in_dim, hidden=hidden, out_dim=out_dim, layers=layers, **kwargs)


