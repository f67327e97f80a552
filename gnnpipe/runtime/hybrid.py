"""One rank of the hybrid: ``W`` pipelines (ways) of ``S`` stages. Chunks are split among the
ways; ranks holding the same stage exchange boundary rows at every aggregation of every chunk
step, and all-reduce their weight gradients once per epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.engine.buffers import LayerBuffers, boundary_rows
from gnnpipe.engine.graph import Adjacency
from gnnpipe.nn import LayerStack
from gnnpipe.runtime.comm import Comm
from gnnpipe.runtime.pipeline import PipelineStage
from gnnpipe.runtime.spec import JobSpec

__all__ = ["HybridStage", "WaySync", "hybrid_program"]


class WaySync:
    """Shares a stage's freshly written boundary rows with the same stage in the other ways."""

    def __init__(self, comm: Comm, spec: JobSpec, adj: Adjacency) -> None:
        self.comm, self.spec = comm, spec
        self.peers = {w: w * spec.job.stages + comm.stage for w in range(spec.job.ways) if w != comm.way}
        self.forward_rows, self.backward_rows = boundary_rows(adj, spec.bounds)
        self.step_chunks: list[int] = []

    def _exchange(self, buffer: Tensor, chunk: int, rows: list[Tensor], kind: str) -> Tensor:
        received = {}
        for w, peer in self.peers.items():
            self.comm.isend(buffer[rows[chunk]], peer, kind, chunk)
            other = self.step_chunks[w]
            received[other] = self.comm.irecv((rows[other].numel(), buffer.size(1)), peer, other,
                                              dtype=buffer.dtype)  # rows as the history holds them
        self.comm.wait_all()
        ids = [rows[c] for c in received]
        for c, values in received.items():
            buffer[rows[c]] = values
        return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long)

    def share_h(self, key: int, buf: LayerBuffers, chunk: int) -> None:
        self._exchange(buf.H, chunk, self.forward_rows, "boundary")

    def share_dz(self, key: int, buf: LayerBuffers, chunk: int) -> Tensor | None:
        return self._exchange(buf.dZ, chunk, self.backward_rows, "boundary_grad")

    def share_pushed(self, key: int, chunk: int, grad: Tensor,
                     rows_of: Callable[[int], int]) -> dict[int, Tensor]:
        received = {}
        for w, peer in self.peers.items():
            self.comm.isend(grad, peer, "boundary_grad", chunk)
            other = self.step_chunks[w]
            received[other] = self.comm.irecv((rows_of(other), grad.size(1)), peer, other)
        self.comm.wait_all()
        return received


class HybridStage(PipelineStage):
    """Rank ``way * S + stage``: GNNPipe's schedule on this way's chunks, boundary rows shared with
    the same stage of the other ways, weight gradients all-reduced across them."""

    def __init__(self, spec: JobSpec, comm: Comm, model: LayerStack, data: Data) -> None:
        groups = [dist.new_group([w * spec.job.stages + s for w in range(spec.job.ways)])
                  for s in range(spec.job.stages)]  # every rank creates every group, in order
        super().__init__(spec, comm, model, data)
        self.group = groups[comm.stage]
        self.sync = WaySync(comm, spec, self.adj.to("cpu"))  # row ids on the CPU index any device
        self.executor.sync = self.sync
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]

    def begin_epoch(self, epoch: int) -> None:
        self.comm.epoch = epoch
        self.optimizer.zero_grad(set_to_none=False)
        self.executor.begin_epoch(epoch)

    def run_chunks(self, epoch: int) -> float | None:
        order, ways = self.order(epoch), self.spec.job.ways
        steps = [order[k * ways:(k + 1) * ways] for k in range(len(order) // ways)]

        def at_step(position: int) -> None:
            self.sync.step_chunks = steps[position]

        mine = [step[self.comm.way] for step in steps]
        loss = self.forward_chunks(mine, at_step)
        self.executor.between_phases()
        self.backward_chunks(mine, at_step)
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        total = torch.tensor([loss], dtype=torch.float32, device=self.comm.device)
        self.comm.allreduce([p.grad for p in self.params] + ([total] if self.is_last else []),
                            group=self.group)
        return float(total) if self.is_last else None

    def evaluate(self) -> dict[str, float]:
        """Way 0 evaluates (its stages hold the same weights as every way's)."""
        return super().evaluate() if self.comm.way == 0 else {}

    def checkpoint_state(self) -> dict[str, Any]:
        """Way 0 keeps the weights and Adam state (the same in every way); every rank its own
        historical buffers (ways fill different rows of them)."""
        if self.comm.way == 0:
            return super().checkpoint_state()
        return ckpt.shard(self.layout, buffers=self.executor.buffer_state())

    def state(self) -> dict[str, Tensor]:
        return super().state() if self.comm.way == 0 else {}


def hybrid_program(spec: JobSpec, comm: Comm, model: LayerStack, data: Data) -> HybridStage:
    return HybridStage(spec, comm, model, data)
