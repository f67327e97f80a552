"""`LayerStack`s: ordered blocks that pipeline stages split into contiguous ranges.

A block never touches the graph itself: it calls ``ctx.aggregate(h, key)`` for ``Â @ h`` and
``ctx.dropout(h, p, key)`` for dropout, so the same block runs exact full-graph
(:mod:`gnnpipe.engine.single`), chunked with historical embeddings (:mod:`gnnpipe.engine.chunked`)
or partitioned with halo exchange, and dropout masks are reproducible per (seed, epoch, chunk, key).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, cast, overload

from torch import Tensor, nn

from gnnpipe.core.kinds import BlockKind

__all__ = ["NORMS", "Block", "Context", "LayerStack", "check_stack"]

#: Adjacency normalisations a block may ask for: symmetric ``D^-1/2 (A+I) D^-1/2`` or row mean.
NORMS = ("sym", "mean")


class Context(Protocol):
    """What a block may ask of the engine running it.

    Outside training (``training`` False) the tensor ``aggregate`` returns is the block's own
    (no buffer or cache keeps it): an inference forward may write its output over it."""

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
def check_stack(model: object) -> LayerStack:
    """``model`` itself if it is a :class:`LayerStack`, else a ``TypeError`` naming what is
    accepted (PyG models are converted before this check: :func:`gnnpipe.pyg.as_stack`)."""
    if not isinstance(model, LayerStack):
        raise TypeError(f"model: expected a gnnpipe LayerStack (gp.models.gcnii(...) etc.) or "
                        f"a PyG BasicGNN / Sequential, got {type(model).__name__}")
    return model
