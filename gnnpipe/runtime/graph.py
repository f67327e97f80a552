"""One rank of graph parallelism: a METIS partition's rows plus halo rows exchanged at every
aggregation (forward: rows to the ranks that need them; backward: their gradients back)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.core.kinds import OpKind
from gnnpipe.engine import state as engine_state
from gnnpipe.engine.buffers import torch_dtype
from gnnpipe.engine.graph import Adjacency, coo_to_csr, csr_mm, normalized_adjacency
from gnnpipe.engine.message_passing import MessageGraphs, halo_message_passing, return_halo_grads
from gnnpipe.engine.single import chunk_loss, keyed_dropout, mask_seed
from gnnpipe.nn import LayerStack
from gnnpipe.runtime.comm import Comm
from gnnpipe.runtime.spec import JobSpec

__all__ = ["GraphContext", "GraphRank", "HaloPlan", "graph_program", "halo_plan"]


@dataclass
class HaloPlan:
    """Rows this rank owns (``lo:hi``), its halo (sorted global ids) and, per peer, which local
    rows it sends and how many halo rows it receives."""

    lo: int
    hi: int
    halo: Tensor
    send_rows: dict[int, Tensor]
    recv_counts: dict[int, int]
    adj: Adjacency  # rows lo:hi over columns [local rows, halo rows]
    graphs: MessageGraphs | None = None  # in-edges of lo:hi for PyG message-passing layers

    def to(self, device: torch.device) -> HaloPlan:
        """Index tensors and the local adjacency on ``device``."""
        return HaloPlan(self.lo, self.hi, self.halo.to(device),
                        {q: r.to(device) for q, r in self.send_rows.items()}, self.recv_counts,
                        self.adj.to(device),
                        None if self.graphs is None else self.graphs.to(device))


def halo_plan(full: Adjacency, bounds: list[int], rank: int) -> HaloPlan:
    """Cut ``full`` (over chunk-ordered nodes, parts contiguous) to this rank's view."""
    lo, hi = bounds[rank], bounds[rank + 1]
    owner = torch.bucketize(torch.arange(full.num_nodes), torch.tensor(bounds[1:]), right=True)
    local = full.rows(lo, hi).A
    cols = local.col_indices()
    halo = torch.unique(cols[(cols < lo) | (cols >= hi)])
    new_cols = torch.where((cols >= lo) & (cols < hi), cols - lo,
                           (hi - lo) + torch.searchsorted(halo, cols))
    rows = torch.repeat_interleave(torch.arange(hi - lo), local.crow_indices().diff())
    shape = (hi - lo, hi - lo + halo.numel())
    adj = Adjacency(coo_to_csr(rows, new_cols, local.values(), shape),
                    coo_to_csr(new_cols, rows, local.values(), (shape[1], shape[0])))
    recv_counts = {int(q): int((owner[halo] == q).sum()) for q in range(len(bounds) - 1) if q != rank}
    send_rows: dict[int, Tensor] = {}
    for q in range(len(bounds) - 1):
        if q == rank:
            continue
        qa = full.rows(bounds[q], bounds[q + 1]).A.col_indices()
        needed = torch.unique(qa[(qa >= lo) & (qa < hi)])
        send_rows[q] = needed - lo
    graphs = None if full.edge_index is None else MessageGraphs(
        full.edge_index, full.num_nodes, [lo, hi], halo)
    return HaloPlan(lo, hi, halo, send_rows, recv_counts, adj, graphs)


class _HaloAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: Tensor, gctx: GraphContext) -> Tensor:
        ctx.gctx = gctx
        halo = gctx.exchange(h.detach(), gctx.kind)
        return csr_mm(gctx.plan.adj.A, torch.cat([h.detach(), halo]))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return return_halo_grads(ctx.gctx, csr_mm(ctx.gctx.plan.adj.AT, grad)), None


class GraphContext:
    """Block context for one rank's partition: aggregation with halo exchange."""

    def __init__(self, plan: HaloPlan, comm: Comm, seed: int, epoch: int, training: bool,
                 wire: torch.dtype = torch.float32,
                 after_swap: Callable[[], None] | None = None) -> None:
        self.plan, self.comm, self.seed, self.epoch, self.training = plan, comm, seed, epoch, training
        self.kind = "halo" if training else "eval"
        self.wire = wire if training else torch.float32  # evaluation's rows go exact
        self.after_swap = after_swap

    def exchange(self, h: Tensor, kind: str) -> Tensor:
        """Send my rows that peers need, receive my halo rows (ordered like ``plan.halo``)."""
        parts = {}
        for q, count in self.plan.recv_counts.items():
            if self.plan.send_rows[q].numel():
                self.comm.isend(h[self.plan.send_rows[q]].to(self.wire), q, kind)
            if count:
                parts[q] = self.comm.irecv((count, h.size(1)), q, dtype=self.wire)
        self.comm.wait_all()
        self.swapped()
        if not parts:
            return h.new_zeros(0, h.size(1))
        return torch.cat([parts[q] for q in sorted(parts)]).to(h.dtype)

    def swapped(self) -> None:
        """After each halo swap, forward or backward: the rank's hook (its heap ceiling)."""
        if self.after_swap is not None:
            self.after_swap()

    def aggregate(self, h: Tensor, key: int) -> Tensor:
        if not self.training:
            return csr_mm(self.plan.adj.A, torch.cat([h, self.exchange(h, "eval")]))
        return _HaloAggregate.apply(h, self)

    def message_passing(self, module: torch.nn.Module, h: Tensor, key: int) -> Tensor:
        """PyG ``module`` on the partition's in-edges, halo rows exchanged (exact)."""
        return halo_message_passing(self, module, h, key)

    def dropout(self, h: Tensor, p: float, key: int) -> Tensor:
        if not self.training or p == 0.0:
            return h
        return keyed_dropout(h, p, mask_seed(self.seed, self.epoch, self.comm.rank, key))


class GraphRank:
    """One rank of graph parallelism (an :class:`~gnnpipe.engine.driver.EpochProgram`): full-graph
    training on its partition, weight gradients all-reduced, one step per epoch."""

    def __init__(self, spec: JobSpec, comm: Comm, model: LayerStack, data: Data) -> None:
        self.spec, self.comm, self.model, self.data = spec, comm, model, data
        full = normalized_adjacency(data.edge_index.cpu(), data.num_nodes, model.norm)
        self.plan = halo_plan(full, spec.bounds, comm.rank).to(comm.device)
        self.wire = torch_dtype(spec.job.wire_dtype)  # halo rows travel in this dtype
        self.optimizer = torch.optim.Adam(
            model.param_groups(spec.job.weight_decay, spec.job.gnn_weight_decay), lr=spec.job.lr)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.num_train = int(data.train_mask.sum())
        plan = self.plan
        self.x, self.y, self.train = (t[plan.lo:plan.hi] for t in (data.x, data.y, data.train_mask))
        self.layout = ckpt.layout(spec.job.mode, spec.job.ranges, spec.node_order, rank=comm.rank)
        #: Called after every halo swap of a training epoch (a rank under a memory limit trims
        #: its heap there: rows under 1 MiB leave holes, as chunk tensors do).
        self.after_swap: Callable[[], None] | None = None

    def begin_epoch(self, epoch: int) -> None:
        self.comm.epoch = epoch
        self.optimizer.zero_grad(set_to_none=False)

    def run_chunks(self, epoch: int) -> float:
        comm = self.comm
        start = comm.now()
        logits = self.model(self.x, GraphContext(self.plan, comm, self.spec.job.seed, epoch,
                                                 training=True, wire=self.wire,
                                                 after_swap=self.after_swap))
        loss = chunk_loss(logits, self.y, self.train, self.num_train)
        comm.record(OpKind.FORWARD, start)
        start = comm.now()
        loss.backward()
        comm.record(OpKind.BACKWARD, start)
        for p in self.params:
            if p.grad is None:  # a parameter this rank's rows never reached
                p.grad = torch.zeros_like(p)
        total = loss.detach().reshape(1).double()
        comm.allreduce([p.grad for p in self.params])
        comm.allreduce([total], kind="control")
        return float(total)

    def step(self, epoch: int) -> None:
        start = self.comm.now()
        self.optimizer.step()
        self.comm.record(OpKind.STEP, start)

    def evaluate(self) -> dict[str, float]:
        """Exact full-graph inference, partitioned; counts summed over ranks."""
        return _evaluate(self.spec, self.model, self.data, self.plan, self.comm)

    def checkpoint_state(self) -> dict[str, Any]:
        """Rank 0 keeps the weights and Adam state (the same on every rank); there are no
        historical buffers."""
        if self.comm.rank != 0:
            return ckpt.shard(self.layout)
        return ckpt.shard(self.layout, engine_state.model_shard(self.model, 0, len(self.model)),
                          engine_state.optimizer_shard(self.optimizer, self.model))

    def restore(self, shards: list[dict[str, Any]]) -> None:
        engine_state.restore_model(self.model, shards)
        engine_state.restore_optimizer(self.optimizer, self.model, shards)

    def state(self) -> dict[str, Tensor]:
        return dict(self.model.state_dict())


def graph_program(spec: JobSpec, comm: Comm, model: LayerStack, data: Data) -> GraphRank:
    return GraphRank(spec, comm, model, data)


def _evaluate(spec: JobSpec, model: LayerStack, data: Data, plan: HaloPlan,
              comm: Comm) -> dict[str, float]:
    """Exact full-graph inference, partitioned; counts summed over ranks."""
    model.eval()
    with torch.no_grad():
        ctx = GraphContext(plan, comm, spec.job.seed, comm.epoch, training=False)
        logits = model(data.x[plan.lo:plan.hi], ctx)
    model.train()
    y = data.y[plan.lo:plan.hi]
    pred = logits.argmax(1)
    stats = []
    for split in ("train", "val", "test"):
        mask = getattr(data, f"{split}_mask")[plan.lo:plan.hi]
        stats += [float((pred[mask] == y[mask]).sum()), float(mask.sum())]
    val = data.val_mask[plan.lo:plan.hi]
    stats.append(float(torch.nn.functional.cross_entropy(logits[val], y[val], reduction="sum")))
    totals = torch.tensor(stats, dtype=torch.float64, device=comm.device)
    comm.allreduce([totals], kind="eval")
    t = totals.tolist()
    out = {f"{s}_acc": t[2 * i] / max(t[2 * i + 1], 1.0) for i, s in enumerate(("train", "val", "test"))}
    out["val_loss"] = t[6] / max(t[3], 1.0)
    return out
