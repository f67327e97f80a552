"""Deep GNNs as `LayerStack`s: ordered blocks that pipeline stages split into contiguous ranges.

A block never touches the graph itself: it calls ``ctx.aggregate(h, key)`` for ``Â @ h`` and
``ctx.dropout(h, p, key)`` for dropout, so the same block runs exact full-graph
(:mod:`gnnpipe.engine.single`), chunked with historical embeddings (:mod:`gnnpipe.engine.chunked`)
or partitioned with halo exchange, and dropout masks are reproducible per (seed, epoch, chunk, key).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnpipe.core.kinds import BlockKind

__all__ = ["MODELS", "NORMS", "Block", "Context", "Dense", "GCNIILayer", "GCNLayer", "LayerStack",
           "ResGCNPlusLayer", "SAGELayer", "build", "check_stack", "gcn", "gcnii", "resgcn_plus",
           "sage"]

#: Adjacency normalisations a block may ask for: symmetric ``D^-1/2 (A+I) D^-1/2`` or row mean.
NORMS = ("sym", "mean")


class Context(Protocol):
    """What a block may ask of the engine running it."""

    training: bool

    def aggregate(self, h: Tensor, key: int) -> Tensor: ...

    def message_passing(self, module: nn.Module, h: Tensor, key: int) -> Tensor:
        """PyG ``module(h, edge_index)`` over the rows' in-edges (any mode; see
        :mod:`gnnpipe.engine.message_passing`)."""

    def dropout(self, h: Tensor, p: float, key: int) -> Tensor: ...


class Block(nn.Module):
    """One entry of a :class:`LayerStack`: ``forward(h, h0, ctx)`` maps ``(h, h0)`` to ``(h, h0)``.

    ``h`` holds the rows being computed (the whole graph, one chunk or one partition: a block
    is row-wise except through ``ctx``); ``h0`` is an initial embedding that deep GNNs mix back
    in (GCNII, APPNP), or None. Return ``h0`` unchanged unless the block sets it (returning None
    passes it on too). Never touch the graph: ``ctx.aggregate(h, self.key)`` is ``Â @ h``, and
    ``ctx.dropout(h, p, self.key)`` is dropout with masks reproducible in every mode.

    Attributes:
        kind: ``"input"``, ``"gnn"`` or ``"output"`` (weight decay groups, reports).
        in_dim: width of ``h`` entering the block (the previous block's ``out_dim``).
        out_dim: width of ``h`` leaving the block.
        aggregates: whether ``forward`` calls ``ctx.aggregate`` (once, on ``out_dim`` columns:
            the byte counts of graph parallelism assume it).
        sets_h0: whether ``forward`` returns a new ``h0`` (``out_dim`` wide): an input projection.
        carries_h0: whether ``forward`` reads ``h0``; the engines then ship ``h0`` across every
            stage boundary between the block that sets it and this one.
        key: position in the stack, set by :class:`LayerStack`; keys buffers and dropout masks.
    """

    kind: BlockKind = BlockKind.GNN
    aggregates: bool = False
    sets_h0: bool = False
    carries_h0: bool = False
    in_dim: int = 0
    out_dim: int = 0
    key: int = 0

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Context) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError


if TYPE_CHECKING:
    class BlockList(nn.ModuleList):
        """How a type checker sees :attr:`LayerStack.blocks`: an ``nn.ModuleList`` holding only
        Blocks (``_check_blocks`` sees to it). At run time it is a plain ``nn.ModuleList``."""

        @overload
        def __getitem__(self, idx: slice) -> BlockList: ...

        @overload
        def __getitem__(self, idx: int) -> Block: ...

        def __getitem__(self, idx: int | slice) -> Block | BlockList: ...

        def __iter__(self) -> Iterator[Block]: ...


class LayerStack(nn.Module):
    """An ordered list of blocks: input projection, ``L`` GNN layers, classifier.

    Args:
        blocks: the blocks in execution order.
        norm: adjacency normalisation the aggregating blocks expect (one of :data:`NORMS`).
        name: model family, for reports.
    """

    def __init__(self, blocks: Sequence[Block], norm: str = "sym", name: str = "custom") -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm: expected one of {NORMS}, got {norm!r}")
        self.blocks = cast("BlockList", nn.ModuleList(_check_blocks(blocks)))
        for i, block in enumerate(self.blocks):
            block.key = i
        self.norm = norm
        self.name = name

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def in_dim(self) -> int:
        """Width of the node features the stack expects."""
        return self.blocks[0].in_dim

    @property
    def out_dim(self) -> int:
        """Width of the last block's output (the classes)."""
        return self.blocks[-1].out_dim

    @property
    def num_layers(self) -> int:
        """Number of aggregating (GNN) layers ``L``."""
        return sum(1 for b in self.blocks if b.aggregates)

    @property
    def hidden(self) -> int:
        """Width of the tensors crossing stage boundaries inside the GNN layers."""
        widths = [b.out_dim for b in self.blocks[:-1]] or [self.blocks[-1].out_dim]
        return max(widths)

    def boundary_widths(self, index: int) -> list[int]:
        """Widths of the tensors entering block ``index`` from the block before: ``[h]`` or, when
        a block from ``index`` on reads ``h0`` (``carries_h0``) before any sets a new one,
        ``[h, h0]``."""
        if not 0 < index < len(self.blocks):
            raise ValueError(f"index: a stage boundary lies between blocks 1 and {len(self) - 1}")
        widths = [self.blocks[index - 1].out_dim]
        for block in self.blocks[index:]:
            if block.carries_h0:
                setter = next((b for b in reversed(self.blocks[:index]) if b.sets_h0), None)
                return widths + [setter.out_dim] if setter is not None else widths
            if block.sets_h0:
                break
        return widths

    def run(self, h: Tensor, ctx: Context, start: int = 0, stop: int | None = None,
            h0: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Run blocks ``start:stop`` on ``(h, h0)``; ``h0`` passes on through blocks that return
        None for it without setting it."""
        for i, block in enumerate(self.blocks[start:stop], start):
            if block.carries_h0 and h0 is None:
                raise RuntimeError(f"blocks[{i}] ({type(block).__name__}) reads h0 "
                                   "(carries_h0=True) but got None: a block before it with "
                                   "sets_h0=True must return it")
            h, out = block(h, h0, ctx)
            h0 = out if out is not None or block.sets_h0 else h0
        return h, h0

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        return self.run(x, ctx)[0]

    def param_groups(self, weight_decay: float, gnn_weight_decay: float | None = None,
                     start: int = 0, stop: int | None = None) -> list[dict]:
        """Optimizer groups of blocks ``start:stop``: GNN-layer weights at ``gnn_weight_decay``,
        the rest (projections, classifier) at ``weight_decay``."""
        gnn_wd = weight_decay if gnn_weight_decay is None else gnn_weight_decay
        blocks = list(self.blocks[start:stop])
        gnn = [p for b in blocks if b.kind == BlockKind.GNN for p in b.parameters()]
        dense = [p for b in blocks if b.kind != BlockKind.GNN for p in b.parameters()]
        groups = [{"params": gnn, "weight_decay": gnn_wd}, {"params": dense, "weight_decay": weight_decay}]
        return [g for g in groups if g["params"]]

    def extra_repr(self) -> str:
        return f"name={self.name!r}, layers={self.num_layers}, norm={self.norm!r}"


def _check_blocks(blocks: object) -> list[Block]:
    """``blocks`` as a list, after refusing what cannot make a stack: not Blocks, widths that do
    not chain, a block reading ``h0`` that nothing before it sets, one module twice."""
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
        one = "; a single block goes in a list: [block]" if isinstance(blocks, nn.Module) else ""
        raise TypeError(f"blocks: expected a list of gnnpipe.models.Block, got "
                        f"{_type_name(blocks)}{one}")
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks: expected at least one gnnpipe.models.Block, got an empty list")
    seen: dict[int, int] = {}
    for i, block in enumerate(blocks):
        if not isinstance(block, Block):
            raise TypeError(f"blocks[{i}]: expected a gnnpipe.models.Block (forward(h, h0, ctx) "
                            f"-> (h, h0)), got {_type_name(block)}{_hint(block)}")
        name = f"blocks[{i}] ({type(block).__name__})"
        for attr in ("in_dim", "out_dim"):
            value = getattr(block, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{attr}: expected a positive integer (set it in "
                                 f"__init__), got {value!r}")
        if i and block.in_dim != blocks[i - 1].out_dim:
            raise ValueError(f"{name}.in_dim: expected {blocks[i - 1].out_dim}, the out_dim of "
                             f"blocks[{i - 1}] ({type(blocks[i - 1]).__name__}), got {block.in_dim}")
        if block.carries_h0 and not any(b.sets_h0 for b in blocks[:i]):
            raise ValueError(f"{name} reads h0 (carries_h0=True): expected a block before it that "
                             "sets h0 (sets_h0=True, e.g. Dense(..., sets_h0=True)), got none")
        if id(block) in seen:
            raise ValueError(f"{name}: expected a new module, got the one at blocks[{seen[id(block)]}] "
                             "again (build one block per position)")
        seen[id(block)] = i
    return blocks


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _hint(value: object) -> str:
    if type(value).__module__.startswith("torch_geometric"):
        return ("; a PyG layer goes in a Block whose forward calls ctx.message_passing(layer, h, "
                "self.key) (README: 'Writing your own block'); gp.models.from_pyg converts a "
                "whole PyG model")
    if isinstance(value, nn.Module):
        return ("; wrap a torch module in a Block (a linear layer: gp.models.Dense; README: "
                "'Writing your own block')")
    return ""


# --------------------------------------------------------------------------- blocks
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
        z = (1.0 - self.alpha) * ctx.aggregate(ctx.dropout(h, self.p, self.key), self.key)
        assert h0 is not None, "GCNIILayer reads h0 (carries_h0=True)"
        z = z + self.alpha * h0
        return F.relu(torch.addmm(z, z, self.weight, beta=1.0 - self.beta, alpha=self.beta)), h0


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


def check_stack(model: object) -> LayerStack:
    """``model`` itself if it is a :class:`LayerStack`, else a ``TypeError`` naming what is
    accepted (PyG models are converted before this check: :func:`gnnpipe.pyg.as_stack`)."""
    if not isinstance(model, LayerStack):
        raise TypeError(f"model: expected a gnnpipe LayerStack (gp.models.gcnii(...) etc.) or "
                        f"a PyG BasicGNN / Sequential, got {type(model).__name__}")
    return model
