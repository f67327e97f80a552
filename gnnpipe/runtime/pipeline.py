"""One rank of GNNPipe's layer pipeline: a stage executor plus activation/gradient transfers."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.core.kinds import OpKind, TrainSchedule
from gnnpipe.engine import state as engine_state
from gnnpipe.engine.buffers import torch_dtype
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.driver import owned
from gnnpipe.engine.graph import Adjacency, normalized_adjacency
from gnnpipe.engine.single import FullGraphContext, metrics
from gnnpipe.nn import LayerStack
from gnnpipe.runtime.comm import Comm, PendingRecv
from gnnpipe.runtime.spec import JobSpec
from gnnpipe.schedule import Schedule, one_f_one_b

__all__ = ["SENDS_IN_FLIGHT", "PipelineStage", "acknowledged", "pipeline_program"]

#: Chunks whose sends a fill-drain pipeline stage keeps pending before it waits for the oldest.
SENDS_IN_FLIGHT = 2


class _NoParameters:
    """The optimizer of a stage whose blocks have no parameters (Adam refuses an empty list):
    nothing to step, no state for a checkpoint."""

    def __init__(self) -> None:
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def acknowledged(schedule: Schedule, peer: int, consumes: OpKind, answers: OpKind) -> dict[int, int]:
    """How many of a rank's messages to ``peer`` have arrived by the time each of ``peer``'s
    answers does: ``peer`` reads message ``k`` (of its ``k``-th ``consumes`` op, e.g. the
    activations of its ``k``-th forward) as that op begins, and sends answer ``j`` (e.g. the
    gradients of its ``j``-th backward) as its ``j``-th ``answers`` op ends; the result maps ``j``
    to the number of messages ``peer`` had read before it."""
    done = {OpKind.FORWARD: 0, OpKind.BACKWARD: 0}
    acks: dict[int, int] = {}
    for op in schedule.ranks[peer]:
        if op.kind not in done:
            continue
        if op.kind is answers:
            acks[done[answers]] = done[consumes]
        done[op.kind] += 1
    return acks


@dataclass
class _Outbox:
    """One direction's sends of a 1F1B epoch, by chunk position, released once the peer's
    answer shows they arrived (:func:`acknowledged`): a stage holds its chunks in flight, not
    every chunk it sent this epoch."""

    acks: dict[int, int]
    sent: list[list[dist.Work]] = field(default_factory=list)
    released: int = 0

    def answered(self, comm: Comm, position: int) -> None:
        """The peer's answer ``position`` is here: release the sends it acknowledges."""
        upto = self.acks.get(position, 0)
        if upto > self.released:
            comm.settle([w for works in self.sent[self.released:upto] for w in works])
            for k in range(self.released, upto):  # a handle holds its tensor
                self.sent[k] = []
            self.released = upto


class PipelineStage:
    """Stage ``comm.stage`` of one pipeline way: its block range, neighbours and executor; the
    rank's :class:`~gnnpipe.engine.driver.EpochProgram` in ``pipeline`` mode.

    Args:
        spec: the job.
        comm: this rank's communicator.
        model, data: this rank's copy of the stack and the chunk-ordered graph, on its device.
    """

    def __init__(self, spec: JobSpec, comm: Comm, model: LayerStack, data: Data) -> None:
        self.spec, self.comm, self.model, self.data = spec, comm, model, data
        s, last = comm.stage, spec.job.stages - 1
        self.start, self.stop = spec.job.ranges[s]
        self.is_first, self.is_last = s == 0, s == last
        self.prev = None if self.is_first else comm.rank - 1
        self.next = None if self.is_last else comm.rank + 1
        self.in_widths = [] if self.is_first else model.boundary_widths(self.start)
        self.out_widths = [] if self.is_last else model.boundary_widths(self.stop)
        self.adj: Adjacency = normalized_adjacency(data.edge_index, data.num_nodes, model.norm)
        self.executor = StageExecutor(model, self.start, self.stop, self.adj, spec.bounds,
                                      spec.job.techniques, spec.job.seed, spec.job.recompute,
                                      history_dtype=torch_dtype(spec.job.history_dtype),
                                      wire_dtype=torch_dtype(spec.job.wire_dtype))
        # a fill-drain stage idles between its phases, waiting; a 1F1B stage has no such phase
        self.executor.upkeep_between_phases = (
            not self.is_last and spec.job.schedule is TrainSchedule.GNNPIPE)
        if spec.job.schedule is TrainSchedule.ONE_F_ONE_B:
            self.executor.cache_in_slots()  # at most S - s chunks between forward and backward
        self.wire = torch_dtype(spec.job.wire_dtype)  # boundary tensors travel in this dtype
        groups = model.param_groups(spec.job.weight_decay, spec.job.gnn_weight_decay, self.start,
                                    self.stop)
        self.optimizer: torch.optim.Optimizer | _NoParameters = (
            torch.optim.Adam(groups, lr=spec.job.lr) if groups else _NoParameters())
        self.num_train = int(data.train_mask.sum())
        self.layout = ckpt.layout(spec.job.mode, spec.job.ranges, spec.node_order, comm.stage, comm.way,
                                  spec.job.ways, comm.rank)

    def rows(self, chunk: int) -> tuple[int, int]:
        return self.spec.bounds[chunk], self.spec.bounds[chunk + 1]

    def _post(self, order: list[int], position: int, peer: int | None,
              widths: list[int]) -> list[PendingRecv]:
        """Start receiving chunk ``order[position]``'s tensors from ``peer`` (none past the ends
        of ``order`` or without a peer)."""
        if peer is None or not 0 <= position < len(order):
            return []
        lo, hi = self.rows(order[position])
        return [self.comm.post_recv((hi - lo, w), peer, order[position], dtype=self.wire)
                for w in widths]

    def _forward_at(self, c: int, inputs: list[Tensor]) -> tuple[float, list[dist.Work]]:
        """Forward chunk ``c`` and send its outputs on; its loss on the last stage (else 0) and
        the sends' handles."""
        comm, data = self.comm, self.data
        lo, hi = self.rows(c)
        target = (data.y[lo:hi], data.train_mask[lo:hi], self.num_train) if self.is_last else None
        start = comm.now()
        outputs = self.executor.forward(c, inputs, target)
        comm.record(OpKind.FORWARD, start, c)
        if self.is_last:
            return float(outputs[0]), []
        assert self.next is not None  # every stage but the last has a next
        # rounded to the wire dtype already: exact
        return 0.0, [comm.isend(out.to(self.wire), self.next, "activation", c) for out in outputs]

    def _backward_at(self, c: int, grads: list[Tensor | None] | None) -> list[dist.Work]:
        """Backward chunk ``c`` and send its input gradients upstream; the sends' handles."""
        comm = self.comm
        lo, hi = self.rows(c)
        start = comm.now()
        grad_inputs = self.executor.backward(c, grads)
        comm.record(OpKind.BACKWARD, start, c)
        if self.is_first:
            return []
        assert self.prev is not None  # every stage but the first has a previous
        sent = []
        for g, w in zip(grad_inputs, self.in_widths):
            if g is None:  # an input this stage never used: a zero gradient
                g = torch.zeros(hi - lo, w, device=comm.device)
            sent.append(comm.isend(g.to(self.wire), self.prev, "gradient", c))
        return sent

    def _inputs(self, order: list[int], position: int,
                incoming: list[PendingRecv]) -> tuple[list[Tensor], list[PendingRecv]]:
        """Chunk ``order[position]``'s inputs (the features on the first stage, else waited
        for), and the next chunk's receives, started while this one computes."""
        if self.is_first:
            lo, hi = self.rows(order[position])
            return [self.data.x[lo:hi]], incoming
        inputs = [r.wait().float() for r in incoming]
        return inputs, self._post(order, position + 1, self.prev, self.in_widths)

    def _grads(self, order: list[int], position: int, step: int, incoming: list[PendingRecv]
               ) -> tuple[list[Tensor | None] | None, list[PendingRecv]]:
        """Chunk ``order[position]``'s output gradients (none on the last stage), and the
        receives of the chunk ``step`` positions on."""
        if self.is_last:
            return None, incoming
        grads: list[Tensor | None] = [r.wait().float() for r in incoming]
        return grads, self._post(order, position + step, self.next, self.out_widths)

    def forward_chunks(self, order: list[int], on_chunk: Callable[[int], None] | None = None,
                       in_flight: int | None = None) -> float:
        """Forward every chunk of ``order``; returns the summed chunk losses on the last stage.
        ``on_chunk(position)`` runs before each chunk (hybrid: which chunks the other ways hold).
        With ``in_flight``, the sends of at most that many chunks are pending: past it the
        stage waits for the oldest (else every send waits for the phase's end)."""
        loss = 0.0
        incoming = self._post(order, 0, self.prev, self.in_widths)
        sent: deque[list[dist.Work]] = deque()
        for position, c in enumerate(order):
            if on_chunk is not None:
                on_chunk(position)
            inputs, incoming = self._inputs(order, position, incoming)
            chunk_loss, works = self._forward_at(c, inputs)
            loss += chunk_loss
            self._bound(sent, works, in_flight)
        self.comm.wait_all()
        return loss

    def _bound(self, sent: deque[list[dist.Work]], works: list[dist.Work],
               in_flight: int | None) -> None:
        """Add a chunk's sends to ``sent``; wait for the oldest chunk's past ``in_flight``. A
        fill-drain peer reads every chunk in order and waits on nothing of this stage's but
        them, so the wait ends (and costs the stage nothing on the critical path: it idles at
        the phase's end anyway); a sent tensor no longer in the stash (``recompute``, a
        compact wire, the gradients) is then freed instead of kept to the phase's end."""
        self.comm.reap()
        if in_flight is None:
            return
        sent.append(works)
        while len(sent) > in_flight:
            self.comm.settle(sent.popleft())

    def backward_chunks(self, order: list[int], on_chunk: Callable[[int], None] | None = None,
                        in_flight: int | None = None) -> None:
        """Backward every chunk of ``order`` in reverse, passing input gradients upstream
        (``on_chunk`` and ``in_flight`` as in :meth:`forward_chunks`)."""
        incoming = self._post(order, len(order) - 1, self.next, self.out_widths)
        sent: deque[list[dist.Work]] = deque()
        for position in range(len(order) - 1, -1, -1):
            if on_chunk is not None:
                on_chunk(position)
            grads, incoming = self._grads(order, position, -1, incoming)
            self._bound(sent, self._backward_at(order[position], grads), in_flight)
        self.comm.wait_all()

    def one_f_one_b_chunks(self, order: list[int]) -> float:
        """This stage's ops of :func:`gnnpipe.schedule.one_f_one_b` (its ``k``-th chunk is
        ``order[k]``): warm-up forwards, then one backward and one forward each, then the last
        backwards, in chunk order. A send is released once the peer's answer shows it arrived
        (the next stage's gradients of a chunk, the previous stage's activations of a later
        one), so a stage holds its chunks in flight, not the epoch's. The summed chunk losses on
        the last stage."""
        schedule, s = one_f_one_b(self.spec.job.stages, len(order)), self.comm.stage
        forward, backward = OpKind.FORWARD, OpKind.BACKWARD
        to_next = _Outbox({} if self.is_last else acknowledged(schedule, s + 1, forward, backward))
        to_prev = _Outbox({} if self.is_first else acknowledged(schedule, s - 1, backward, forward))
        forwards = self._post(order, 0, self.prev, self.in_widths)
        backwards = self._post(order, 0, self.next, self.out_widths)
        done = {forward: 0, backward: 0}
        loss = 0.0
        for op in schedule.ranks[s]:
            position = done[op.kind]
            if op.kind is forward:
                inputs, forwards = self._inputs(order, position, forwards)
                to_prev.answered(self.comm, position)
                chunk_loss, sent = self._forward_at(order[position], inputs)
                loss += chunk_loss
                to_next.sent.append(sent)
            else:
                grads, backwards = self._grads(order, position, 1, backwards)
                to_next.answered(self.comm, position)
                to_prev.sent.append(self._backward_at(order[position], grads))
            done[op.kind] += 1
            self.comm.reap()
        self.comm.wait_all()
        return loss

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Exact full-graph inference pipelined through the stages; metrics on the last stage."""
        comm, data, model = self.comm, self.data, self.model
        model.eval()
        n = data.num_nodes
        tensors: list[Tensor] = ([data.x] if self.prev is None  # the first stage
                                 else [comm.recv((n, w), self.prev) for w in self.in_widths])
        h0_in = tensors[1] if len(tensors) > 1 else None
        # handed over, not kept: the first block's input is freed once it has read it
        h, h0 = model.run(tensors.pop(0), FullGraphContext(self.adj), self.start, self.stop,
                          h0_in)
        model.train()
        if self.is_last:
            return metrics(h, data)
        assert self.next is not None  # every stage but the last has a next
        outputs = [h]
        if len(self.out_widths) > 1:
            assert h0 is not None, "the boundary carries h0: a block before it sets h0"
            outputs.append(h0)
        for out in outputs:
            comm.isend(out, self.next, "eval")
        comm.wait_all()
        return {}

    # ------------------------------------------------------------------ EpochProgram
    def begin_epoch(self, epoch: int) -> None:
        self.comm.epoch = epoch
        self.optimizer.zero_grad(set_to_none=True)
        self.executor.begin_epoch(epoch)

    def order(self, epoch: int) -> list[int]:
        return chunk_order(len(self.spec.bounds) - 1, self.spec.job.seed, epoch,
                           self.spec.job.techniques.random_order)

    def run_chunks(self, epoch: int) -> float | None:
        order = self.order(epoch)
        if self.spec.job.schedule is TrainSchedule.ONE_F_ONE_B:
            loss = self.one_f_one_b_chunks(order)
            return loss if self.is_last else None
        loss = self.forward_chunks(order, in_flight=SENDS_IN_FLIGHT)
        self.executor.between_phases()  # while the later stages finish this epoch's chunks
        self.backward_chunks(order, in_flight=SENDS_IN_FLIGHT)
        return loss if self.is_last else None

    def step(self, epoch: int) -> None:
        """Optimizer step and snapshot."""
        start = self.comm.now()
        self.optimizer.step()
        self.comm.record(OpKind.STEP, start)
        self.executor.end_epoch()

    def checkpoint_state(self) -> dict[str, Any]:
        return ckpt.shard(self.layout, engine_state.model_shard(self.model, self.start, self.stop),
                          engine_state.optimizer_shard(self.optimizer, self.model),
                          self.executor.buffer_state())

    def restore(self, shards: list[dict[str, Any]]) -> None:
        """The stage's blocks and Adam state from a checkpoint of any layout; its historical
        buffers where they carry over (:func:`gnnpipe.checkpoint.restore_buffers`)."""
        engine_state.restore_model(self.model, shards, self.start, self.stop)
        engine_state.restore_optimizer(self.optimizer, self.model, shards)
        self.executor.load_buffer_state(shards, self.layout)

    def state(self) -> dict[str, Tensor]:
        """The final weights of the stage's blocks."""
        return owned(self.model.state_dict(), self.start, self.stop)


def pipeline_program(spec: JobSpec, comm: Comm, model: LayerStack, data: Data) -> PipelineStage:
    """GNNPipe's chunked epoch on one stage, fill-drain or 1F1B (``job.schedule``); one optimizer
    step per epoch."""
    return PipelineStage(spec, comm, model, data)
