"""One rank of GNNPipe's layer pipeline: a stage executor plus activation/gradient transfers."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.graph import Adjacency, normalized_adjacency
from gnnpipe.engine.single import FullGraphContext, evaluates, metrics
from gnnpipe.runtime.comm import Comm, PendingRecv
from gnnpipe.runtime.rank import EpochReporter, JobSpec


class PipelineStage:
    """Stage ``comm.stage`` of one pipeline way: its block range, neighbours and executor."""

    def __init__(self, spec: JobSpec, comm: Comm, executor_kwargs: dict | None = None) -> None:
        self.spec, self.comm = spec, comm
        s, last = comm.stage, spec.stages - 1
        self.start, self.stop = spec.ranges[s]
        self.is_first, self.is_last = s == 0, s == last
        self.prev = None if self.is_first else comm.rank - 1
        self.next = None if self.is_last else comm.rank + 1
        self.in_widths = [] if self.is_first else spec.model.boundary_widths(self.start)
        self.out_widths = [] if self.is_last else spec.model.boundary_widths(self.stop)
        data = spec.data
        self.adj: Adjacency = normalized_adjacency(data.edge_index, data.num_nodes, spec.model.norm)
        self.executor = StageExecutor(spec.model, self.start, self.stop, self.adj, spec.bounds,
                                      spec.techniques, spec.seed, spec.recompute,
                                      **(executor_kwargs or {}))
        self.optimizer = torch.optim.Adam(
            spec.model.param_groups(spec.weight_decay, spec.gnn_weight_decay, self.start, self.stop),
            lr=spec.lr)
        self.num_train = int(data.train_mask.sum())

    def rows(self, chunk: int) -> tuple[int, int]:
        return self.spec.bounds[chunk], self.spec.bounds[chunk + 1]

    def _post(self, order: list[int], position: int, peer: int | None,
              widths: list[int]) -> list[PendingRecv]:
        """Start receiving chunk ``order[position]``'s tensors from ``peer`` (none past the ends
        of ``order`` or without a peer)."""
        if peer is None or not 0 <= position < len(order):
            return []
        lo, hi = self.rows(order[position])
        return [self.comm.post_recv((hi - lo, w), peer, order[position]) for w in widths]

    def forward_chunks(self, order: list[int], on_chunk: Callable[[int], None] | None = None) -> float:
        """Forward every chunk of ``order``; returns the summed chunk losses on the last stage.
        ``on_chunk(position)`` runs before each chunk (hybrid: which chunks the other ways hold)."""
        comm, data, loss = self.comm, self.spec.data, 0.0
        incoming = self._post(order, 0, self.prev, self.in_widths)
        for position, c in enumerate(order):
            if on_chunk is not None:
                on_chunk(position)
            lo, hi = self.rows(c)
            if self.is_first:
                inputs = [data.x[lo:hi]]
            else:  # wait for this chunk, then start receiving the next one while computing
                inputs = [r.wait() for r in incoming]
                incoming = self._post(order, position + 1, self.prev, self.in_widths)
            target = (data.y[lo:hi], data.train_mask[lo:hi], self.num_train) if self.is_last else None
            start = comm.now()
            outputs = self.executor.forward(c, inputs, target)
            comm.record("forward", start, c)
            if self.is_last:
                loss += float(outputs[0])
            else:
                for out in outputs:
                    comm.isend(out, self.next, "activation", c)
        comm.wait_all()
        return loss

    def backward_chunks(self, order: list[int], on_chunk: Callable[[int], None] | None = None) -> None:
        """Backward every chunk of ``order`` in reverse, passing input gradients upstream."""
        comm = self.comm
        incoming = self._post(order, len(order) - 1, self.next, self.out_widths)
        for position in range(len(order) - 1, -1, -1):
            c = order[position]
            if on_chunk is not None:
                on_chunk(position)
            lo, hi = self.rows(c)
            grads = None
            if not self.is_last:
                grads = [r.wait() for r in incoming]
                incoming = self._post(order, position - 1, self.next, self.out_widths)
            start = comm.now()
            grad_inputs = self.executor.backward(c, grads)
            comm.record("backward", start, c)
            if not self.is_first:
                for g, w in zip(grad_inputs, self.in_widths):
                    if g is None:  # an input this stage never used: a zero gradient
                        g = torch.zeros(hi - lo, w, device=comm.device)
                    comm.isend(g, self.prev, "gradient", c)
        comm.wait_all()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Exact full-graph inference pipelined through the stages; metrics on the last stage."""
        comm, data, model = self.comm, self.spec.data, self.spec.model
        model.eval()
        n = data.num_nodes
        tensors: list[Tensor] = ([data.x] if self.is_first
                                 else [comm.recv((n, w), self.prev) for w in self.in_widths])
        h, h0 = model.run(tensors[0], FullGraphContext(self.adj), self.start, self.stop,
                          tensors[1] if len(tensors) > 1 else None)
        model.train()
        if self.is_last:
            return metrics(h, data)
        for out in ([h, h0] if len(self.out_widths) > 1 else [h]):
            comm.isend(out, self.next, "eval")
        comm.wait_all()
        return {}

    def finish_epoch(self, epoch: int, began: float, loss: float, evaluate: bool = True) -> dict:
        """Optimizer step and snapshot, then the epoch's record: its time (since ``began``), the
        loss on the last stage and, with ``evaluate`` on an evaluation epoch (``eval_every``),
        the exact full-graph metrics."""
        start = self.comm.now()
        self.optimizer.step()
        self.comm.record("step", start)
        self.executor.end_epoch()
        record = {"epoch": epoch, "epoch_time": time.perf_counter() - began}
        if self.is_last:
            record["loss"] = loss
        if evaluate and evaluates(epoch, self.spec.epochs, self.spec.eval_every):
            record.update(self.evaluate())
        return record

    def state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.spec.model.state_dict().items()
                if int(k.split(".")[1]) in range(self.start, self.stop)}


def pipeline_rank(spec: JobSpec, comm: Comm, reporter: EpochReporter) -> dict[str, Tensor]:
    """Train with GNNPipe's chunked fill-drain schedule; one optimizer step per epoch."""
    stage = PipelineStage(spec, comm)
    for epoch in range(spec.epochs):
        comm.epoch = epoch
        began = time.perf_counter()
        stage.optimizer.zero_grad(set_to_none=True)
        stage.executor.begin_epoch(epoch)
        order = chunk_order(len(spec.bounds) - 1, spec.seed, epoch, spec.techniques.random_order)
        loss = stage.forward_chunks(order)
        stage.backward_chunks(order)
        if reporter.report(stage.finish_epoch(epoch, began, loss)):
            break
    return stage.state()
