"""Any PyG ``MessagePassing`` layer in every mode: ``ctx.message_passing(module, h, key)``.

The module runs as ``module(x, edge_index)`` on a *local graph*: the edges into a range of target
rows (a chunk, or a graph-parallel rank's partition), the targets numbered first, then the other
source rows. Outputs of the targets are kept. This is exact when a target's output depends only on
its in-edges and the features at both ends (one hop), which holds for PyG's one-hop convolutions;
GCN-style symmetric normalisation also needs the *sources'* full-graph degrees, so for ``GCNConv``
and ``LGConv`` it is computed once on the whole graph and handed to the module.

Chunked (docs/design.md §5, "generalised pull"): chunk ``c`` reads its sources from the stage's ``Hbuf``
(fresh or historical rows). Its backward *pushes* ``∂Z[c]/∂H[S]ᵀ dZ[c]`` for the other chunks'
source rows ``S`` into the gradient buffer ``Gbuf`` (the layer's ``LayerBuffers.dZ``, reset per
epoch like ``dZbuf``) — at 2× with unbiased gradients on — and takes ``Gbuf[c]`` plus its own term
as its input gradient. For a linear layer this is exactly the pull of ``_ChunkAggregate``. With
unbiased gradients off, each chunk's last push is kept and replaced by the next one, so ``Gbuf[c]``
holds every other chunk's latest contribution: the pull's "last epoch's ``dZ``" rule, with each
chunk's own Jacobian.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["MessageGraphs", "Seed", "check_exact_in_graph_mode", "check_module",
           "chunk_message_passing", "full_message_passing", "halo_message_passing",
           "return_halo_grads"]

#: Message-passing layers that look further than one hop or need more than ``(x, edge_index)``.
_REFUSED = {
    "SGConv": "propagates K hops", "SSGConv": "propagates K hops", "APPNP": "propagates K hops",
    "TAGConv": "propagates K hops", "ChebConv": "propagates K hops", "ARMAConv": "propagates K hops",
    "MixHopConv": "propagates several hops", "GatedGraphConv": "propagates num_layers hops",
    "GCN2Conv": "needs x_0 beside x (use gp.models.gcnii)", "FAConv": "needs x_0 beside x",
    "DNAConv": "needs every layer's history", "SuperGATConv": "samples negative edges",
}
#: Convolutions whose edge weights use both ends' full-graph degrees (``gcn_norm``).
_GCN_NORMED = ("GCNConv", "LGConv")


def check_module(module: Any, where: str = "module") -> None:
    """``module`` is a PyG ``MessagePassing`` that looks one hop and needs only ``(x, edge_index)``."""
    from torch_geometric.nn import MessagePassing

    if not isinstance(module, MessagePassing):
        raise TypeError(f"{where}: expected a torch_geometric MessagePassing layer, "
                        f"got {type(module).__name__}")
    name = type(module).__name__
    reason = next((why for cls, why in _REFUSED.items()
                   if any(c.__name__ == cls for c in type(module).__mro__)), None)
    if reason is not None:
        raise ValueError(f"{where}: {name} {reason}, which chunked and graph-parallel training "
                         f"cannot cut into one-hop pieces; use one-hop layers (GCNConv, SAGEConv, "
                         f"GINConv, GATConv, ...)")


def _inner_dropout(module: nn.Module, where: str = "module") -> str | None:
    """The path of a part of ``module`` that drops out inside the layer (GATConv's attention
    dropout, an nn.Dropout in an inner MLP), or None."""
    for path, sub in module.named_modules():
        rate = sub.p if isinstance(sub, nn.Dropout) else getattr(sub, "dropout", None)
        rates = rate if isinstance(rate, (list, tuple)) else [rate]
        if any(isinstance(r, float) and r > 0.0 for r in rates):
            return f"{where}.{path}" if path else where
    return None


def check_exact_in_graph_mode(module: nn.Module, where: str) -> None:
    """Graph parallelism equals single: refuse a layer whose own dropout it cannot reproduce."""
    part = _inner_dropout(module, where)
    if part is not None:
        raise ValueError(f"{part}: drops out inside the layer, over each partition's own edges, "
                         f"which mode 'graph' cannot make equal to the whole graph's masks; set "
                         f"its dropout to 0 or use 'pipeline'")


@contextmanager
def _keyed_rng(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run the layer with torch's generator of ``device`` seeded by ``seed`` (then restored), so
    its own dropout draws the same masks in every mode, chunk by chunk; no-op for None."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def _variant(module: nn.Module) -> tuple[Any, ...]:
    """Which edge list the module needs: the raw one, or ``gcn_norm``'s with these settings."""
    flow = getattr(module, "flow", "source_to_target")
    if type(module).__name__ in _GCN_NORMED and getattr(module, "normalize", False):
        return ("gcn", flow, bool(getattr(module, "improved", False)),
                bool(getattr(module, "add_self_loops", True)))
    return ("raw", flow)


@dataclass
class _LocalGraph:
    """Edges into targets ``lo:hi``: local ids ``0:hi-lo`` are the targets, then ``others``."""

    num_targets: int
    others: Tensor
    edge_index: Tensor
    edge_weight: Tensor | None
    variant: tuple[Any, ...]


def _local_graph(edge_index: Tensor, weight: Tensor | None, lo: int, hi: int, variant: tuple,
                others: Tensor | None = None) -> _LocalGraph:
    """Cut the edges into rows ``lo:hi`` out of ``edge_index`` and renumber them locally; the
    other sources are ``others`` if given (a graph-parallel halo, sorted), else found here."""
    tgt_row = 1 if variant[1] == "source_to_target" else 0
    keep = (edge_index[tgt_row] >= lo) & (edge_index[tgt_row] < hi)
    ei = edge_index[:, keep]
    src, tgt = ei[1 - tgt_row], ei[tgt_row]
    inside = (src >= lo) & (src < hi)
    outside = src[~inside]
    if others is None:
        others = torch.unique(outside)
    position = torch.searchsorted(others, outside)
    if outside.numel() and (int(position.max()) >= others.numel()
                            or not torch.equal(others[position], outside)):
        raise RuntimeError("_local_graph: an edge's source is missing from the halo")
    local_src = src - lo
    local_src[~inside] = (hi - lo) + position
    pair = [local_src, tgt - lo] if tgt_row == 1 else [tgt - lo, local_src]
    return _LocalGraph(hi - lo, others, torch.stack(pair), None if weight is None else weight[keep],
                      variant)


@dataclass
class MessageGraphs:
    """Per variant and chunk, the local graphs of a chunk-ordered graph, built on first use.

    Args:
        edge_index: the whole (chunk-ordered) graph's edges.
        num_nodes: its node count.
        bounds: ``C + 1`` row offsets of the target ranges.
        halo: graph-parallel ranks: the fixed other-source rows of their one range.
    """

    edge_index: Tensor
    num_nodes: int
    bounds: Sequence[int]
    halo: Tensor | None = None
    pushed: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    _full: dict[tuple, tuple[Tensor, Tensor | None]] = field(default_factory=dict)
    _local: dict[tuple, _LocalGraph] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> MessageGraphs:
        halo = None if self.halo is None else self.halo.to(device)
        return MessageGraphs(self.edge_index.to(device), self.num_nodes, self.bounds, halo)

    def full(self, variant: tuple) -> tuple[Tensor, Tensor | None]:
        """The whole graph's edge list (and weights) for ``variant``."""
        if variant not in self._full:
            ei, weight = self.edge_index, None
            if variant[0] == "gcn":
                from torch_geometric.nn.conv.gcn_conv import gcn_norm

                ei, weight = gcn_norm(ei, None, self.num_nodes, improved=variant[2],
                                      add_self_loops=variant[3], flow=variant[1])
            self._full[variant] = (ei, weight)
        return self._full[variant]

    def local(self, module: nn.Module, chunk: int) -> _LocalGraph:
        variant = _variant(module)
        if (variant, chunk) not in self._local:
            check_module(module)
            ei, weight = self.full(variant)
            self._local[variant, chunk] = _local_graph(
                ei, weight, int(self.bounds[chunk]), int(self.bounds[chunk + 1]), variant, self.halo)
        return self._local[variant, chunk]


@contextmanager
def _normalised_already(module: nn.Module, graph: _LocalGraph) -> Iterator[None]:
    """Turn the module's own normalisation off while it gets full-graph edge weights."""
    if graph.variant[0] != "gcn":
        yield
        return
    # a plain flag: torch types Module.__setattr__'s value as Tensor | Module only
    module.normalize = False  # type: ignore[assignment]
    try:
        yield
    finally:
        module.normalize = True  # type: ignore[assignment]


#: A layer's generator seed, computed only for a layer that needs one (off the hot path).
Seed = Callable[[], int]


def _layer_seed(module: nn.Module, seed: Seed | None) -> int | None:
    """``seed()`` if ``module`` is training and drops out inside itself, else None."""
    if seed is None or not module.training or _inner_dropout(module) is None:
        return None
    return seed()


def _call_module(module: nn.Module, x: Tensor, graph: _LocalGraph, seed: Seed | None) -> Tensor:
    """``module(x, edge_index)`` on the local graph (its own randomness seeded by ``seed``); the
    targets' output rows."""
    with _normalised_already(module, graph), _keyed_rng(_layer_seed(module, seed), x.device):
        if graph.edge_weight is None:
            out = module(x, graph.edge_index)
        else:
            out = module(x, graph.edge_index, graph.edge_weight)
    if not isinstance(out, Tensor) or out.dim() != 2 or out.size(0) != x.size(0):
        raise TypeError(f"module: {type(module).__name__} must return one [nodes, width] tensor, "
                        f"got {type(out).__name__}")
    return out[:graph.num_targets]


def full_message_passing(module: nn.Module, h: Tensor, edge_index: Tensor | None,
                         seed: Seed) -> Tensor:
    """The exact whole-graph call ``module(h, edge_index)``, its own randomness seeded by
    ``seed`` (as chunk 0 of a one-chunk run seeds it)."""
    if edge_index is None:
        raise RuntimeError("message_passing: this adjacency has no edge_index; build it with "
                           "gnnpipe.engine.graph.normalized_adjacency")
    check_module(module)
    with _keyed_rng(_layer_seed(module, seed), h.device):
        out = module(h, edge_index)
    if not isinstance(out, Tensor) or out.dim() != 2 or out.size(0) != h.size(0):
        raise TypeError(f"module: {type(module).__name__} must return one [nodes, width] tensor, "
                        f"got {type(out).__name__}")
    return out


# --------------------------------------------------------------------------- chunked
class _AddPushed(torch.autograd.Function):
    """Identity forward; backward adds the gradient other chunks pushed into ``Gbuf[lo:hi]``, then
    lets the pushes this chunk step received from other ways count a second time (for chunks
    after it; see :func:`_pusher`)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, gbuf: Tensor, lo: int, hi: int,
                deferred: list[tuple[Tensor, Tensor]]) -> Tensor:
        ctx.gbuf, ctx.lo, ctx.hi, ctx.deferred = gbuf, lo, hi, deferred
        return h.view_as(h)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        out = grad + ctx.gbuf[ctx.lo:ctx.hi]
        for rows, pushed in ctx.deferred:
            ctx.gbuf.index_add_(0, rows, pushed.to(ctx.gbuf.dtype))
        ctx.deferred.clear()
        return out, None, None, None, None


def _pusher(gbuf: Tensor, graphs: MessageGraphs, module: nn.Module, key: int, chunk: int,
            unbiased: bool, sync: Any,
            deferred: list[tuple[Tensor, Tensor]]) -> Callable[[Tensor], None]:
    """Hook on a chunk's source rows: push their gradient into ``Gbuf`` (see module docstring).

    In the hybrid, the pushes of the chunks the other ways run at this step arrive here too
    (the hook runs before the chunk's own input gradient reads ``Gbuf``). With unbiased gradients
    they count once for this chunk, as a linear layer's pull reads their fresh ``dZ`` rows once,
    and twice for the chunks after it: the second half waits in ``deferred``."""
    def push(grad: Tensor) -> None:
        pushes = {chunk: grad}
        if sync is not None:
            pushes.update(sync.share_pushed(
                key, chunk, grad, lambda c: graphs.local(module, c).others.numel()))
        for c, g in pushes.items():
            rows = graphs.local(module, c).others
            g = g.to(gbuf.dtype)  # stored as the history is (a compact Gbuf rounds it)
            if unbiased:
                gbuf.index_add_(0, rows, 2.0 * g if c == chunk else g)
                if c != chunk:
                    deferred.append((rows, g))
                continue
            previous = graphs.pushed.get((key, c))
            gbuf.index_add_(0, rows, g if previous is None else g - previous)
            graphs.pushed[key, c] = g.detach().clone()
    return push


def chunk_message_passing(cctx: Any, module: nn.Module, h: Tensor, key: int,
                          seed: Seed) -> Tensor:
    """``ChunkContext.message_passing``: chunk ``cctx.chunk``'s output rows with historical
    sources, a pushing backward, and recomputation's replay (the sources are cached). In the
    hybrid, fresh rows and pushes are shared with the other ways (``ex.sync``)."""
    ex = cctx.ex
    if ex.message_graphs is None:
        raise RuntimeError("message_passing: the stage's adjacency has no edge_index")
    graph = ex.message_graphs.local(module, cctx.chunk)
    if ex.sync is not None and graph.variant[1] != "source_to_target":
        raise ValueError(f"mode: 'hybrid' shares the rows messages flow from; "
                         f"{type(module).__name__} has flow={graph.variant[1]!r}, expected "
                         f"'source_to_target' (or use 'pipeline')")
    # Gbuf accumulates each chunk's latest push as differences epoch after epoch: kept in the
    # computation's dtype where it has memory of its own, so rounding does not build up
    buf = ex.buffers_for(key, h.size(1), grad=torch.is_grad_enabled() and h.requires_grad,
                         grad_dtype=h.dtype)
    lo, hi = cctx.lo, cctx.hi
    if cctx.replay and cctx.cache is not None:
        src = cctx.cache[key]
    else:
        buf.H[lo:hi] = h.detach()
        if ex.sync is not None:
            ex.sync.share_h(key, buf, cctx.chunk)
        src = buf.H[graph.others].to(h.dtype)  # a compact history is read back as h's dtype
        if cctx.cache is not None:
            cctx.cache[key] = src
    if torch.is_grad_enabled() and h.requires_grad:
        deferred: list[tuple[Tensor, Tensor]] = []
        h = _AddPushed.apply(h, buf.dZ, lo, hi, deferred)
        src = src.detach().requires_grad_(True)
        src.register_hook(_pusher(buf.dZ, ex.message_graphs, module, key, cctx.chunk,
                                  ex.techniques.unbiased_grad, ex.sync, deferred))
    return _call_module(module, torch.cat([h, src]), graph, seed)


# --------------------------------------------------------------------------- graph parallel
def return_halo_grads(gctx: Any, grad: Tensor) -> Tensor:
    """Gradient of ``[own rows; halo rows]`` -> own rows': halo rows' gradients go back to their
    owners, and the peers' gradients for my rows are added in (``gctx.swapped()`` once they
    have crossed: the rank's hook after every swap)."""
    plan, comm = gctx.plan, gctx.comm
    n_local = plan.hi - plan.lo
    local, halo = grad[:n_local].clone(), grad[n_local:]
    offset, received = 0, {}
    for q, count in plan.recv_counts.items():  # halo rows are ordered by owner
        if plan.send_rows[q].numel():
            received[q] = comm.irecv((plan.send_rows[q].numel(), grad.size(1)), q,
                                     dtype=gctx.wire)
        if count:
            comm.isend(halo[offset:offset + count].to(gctx.wire), q, "halo_grad")
        offset += count
    comm.wait_all()
    gctx.swapped()
    for q, rows in received.items():
        local.index_add_(0, plan.send_rows[q], rows.to(local.dtype))
    return local


class _HaloRows(torch.autograd.Function):
    """``[h; halo rows of h]`` with the halo exchanged; backward returns halo gradients."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, gctx: Any) -> Tensor:
        ctx.gctx = gctx
        return torch.cat([h.detach(), gctx.exchange(h.detach(), gctx.kind)])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return return_halo_grads(ctx.gctx, grad), None


def halo_message_passing(gctx: Any, module: nn.Module, h: Tensor, key: int) -> Tensor:
    """``GraphContext.message_passing``: the partition's in-edges, halo rows exchanged (exact)."""
    graphs = gctx.plan.graphs
    if graphs is None:
        raise RuntimeError("message_passing: this halo plan has no edge_index")
    graph = graphs.local(module, 0)
    if gctx.training and module.training:
        check_exact_in_graph_mode(module, type(module).__name__)
    if gctx.training and torch.is_grad_enabled():
        x = _HaloRows.apply(h, gctx)
    else:
        x = torch.cat([h, gctx.exchange(h, gctx.kind)])
    return _call_module(module, x, graph, None)
