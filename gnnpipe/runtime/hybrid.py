"""One rank of the hybrid: ``W`` pipelines (ways) of ``S`` stages. Chunks are split among the
ways; ranks holding the same stage exchange boundary rows at every aggregation of every chunk
step, and all-reduce their weight gradients once per epoch."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor

from gnnpipe.engine.chunked import LayerBuffers, chunk_order
from gnnpipe.engine.graph import Adjacency
from gnnpipe.runtime.comm import Comm
from gnnpipe.runtime.pipeline import PipelineStage
from gnnpipe.runtime.rank import EpochReporter, JobSpec


def _rows_reaching_outside(part: Tensor, lo: int, hi: int) -> Tensor:
    """Global ids of the rows of CSR ``part`` (rows ``lo:hi``) with a column outside ``lo:hi``."""
    cols = part.col_indices()
    row = torch.repeat_interleave(torch.arange(hi - lo), part.crow_indices().diff())
    return torch.unique(row[(cols < lo) | (cols >= hi)]) + lo


def boundary_rows(adj: Adjacency, bounds: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Per chunk, the rows other chunks read: forward ``Hbuf`` rows (``Â[r, i] != 0`` for some
    ``r`` outside, i.e. ``Âᵀ`` rows reaching outside) and backward ``dZbuf`` rows (``Â`` rows)."""
    forward, backward = [], []
    for c in range(len(bounds) - 1):
        lo, hi = bounds[c], bounds[c + 1]
        rows = adj.rows(lo, hi)
        forward.append(_rows_reaching_outside(rows.AT, lo, hi))
        backward.append(_rows_reaching_outside(rows.A, lo, hi))
    return forward, backward


class WaySync:
    """Shares a stage's freshly written boundary rows with the same stage in the other ways."""

    def __init__(self, comm: Comm, spec: JobSpec, adj: Adjacency) -> None:
        self.comm, self.spec = comm, spec
        self.peers = {w: w * spec.stages + comm.stage for w in range(spec.ways) if w != comm.way}
        self.forward_rows, self.backward_rows = boundary_rows(adj, spec.bounds)
        self.step_chunks: list[int] = []

    def _exchange(self, buffer: Tensor, chunk: int, rows: list[Tensor], kind: str) -> Tensor:
        received = {}
        for w, peer in self.peers.items():
            self.comm.isend(buffer[rows[chunk]], peer, kind, chunk)
            other = self.step_chunks[w]
            received[other] = self.comm.irecv((rows[other].numel(), buffer.size(1)), peer, other)
        self.comm.wait_all()
        ids = [rows[c] for c in received]
        for c, values in received.items():
            buffer[rows[c]] = values
        return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long)

    def share_h(self, key: int, buf: LayerBuffers, chunk: int) -> None:
        self._exchange(buf.H, chunk, self.forward_rows, "boundary")

    def share_dz(self, key: int, buf: LayerBuffers, chunk: int) -> Tensor | None:
        return self._exchange(buf.dZ, chunk, self.backward_rows, "boundary_grad")


def hybrid_rank(spec: JobSpec, comm: Comm, reporter: EpochReporter) -> dict[str, Tensor]:
    """Rank ``way * S + stage``: GNNPipe's schedule on this way's chunks, rows shared across ways."""
    groups = [dist.new_group([w * spec.stages + s for w in range(spec.ways)])
              for s in range(spec.stages)]
    group = groups[comm.stage]
    stage = PipelineStage(spec, comm)
    sync = WaySync(comm, spec, stage.adj.to("cpu"))  # row ids on the CPU index any device
    stage.executor.sync = sync
    params = [p for g in stage.optimizer.param_groups for p in g["params"]]
    num_chunks, ways = len(spec.bounds) - 1, spec.ways
    for epoch in range(spec.epochs):
        comm.epoch = epoch
        began = time.perf_counter()
        stage.optimizer.zero_grad(set_to_none=False)
        stage.executor.begin_epoch(epoch)
        order = chunk_order(num_chunks, spec.seed, epoch, spec.techniques.random_order)
        steps = [order[k * ways:(k + 1) * ways] for k in range(num_chunks // ways)]

        def at_step(position: int, steps: list[list[int]] = steps) -> None:
            sync.step_chunks = steps[position]

        mine = [step[comm.way] for step in steps]
        loss = stage.forward_chunks(mine, at_step)
        stage.backward_chunks(mine, at_step)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        total = torch.tensor([loss], dtype=torch.float32, device=comm.device)
        comm.allreduce([p.grad for p in params] + ([total] if stage.is_last else []), group=group)
        record = stage.finish_epoch(epoch, began, float(total), evaluate=comm.way == 0)
        if reporter.report(record):
            break
    return stage.state() if comm.way == 0 else {}
