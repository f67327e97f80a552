"""GNNPipe's chunked epoch: historical-embedding aggregation with a pull-style backward.

A :class:`StageExecutor` owns a contiguous range of a :class:`~gnnpipe.models.LayerStack` and, for
each aggregating block in it, a full-graph input buffer ``Hbuf``, its snapshot and a gradient
buffer ``dZbuf`` (docs/design.md §5). It runs one chunk forward or backward at a time; the local engine
(:class:`LocalEngine`) chains stages in one process and the distributed runtime puts one executor
on each rank and adds communication, so both compute exactly the same thing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.buffers import LayerBuffers, RowSync
from gnnpipe.engine.graph import Adjacency, ChunkRows, chunk_rows
from gnnpipe.engine.message_passing import MessageGraphs, chunk_message_passing
from gnnpipe.engine.single import LAYER_RNG_KEY, chunk_loss, keyed_dropout, mask_seed
from gnnpipe.nn import LayerStack

__all__ = ["ChunkContext", "StageExecutor", "chunk_order"]

logger = logging.getLogger(__name__)


_ORDER_KEY = 1 << 30  # a (chunk, key) pair no dropout mask uses


def chunk_order(num_chunks: int, seed: int, epoch: int, random_order: bool) -> list[int]:
    """The chunk order of an epoch: identical on every stage for the same (seed, epoch)."""
    if not random_order:
        return list(range(num_chunks))
    gen = torch.Generator().manual_seed(mask_seed(seed, epoch, _ORDER_KEY, _ORDER_KEY))
    return torch.randperm(num_chunks, generator=gen).tolist()


class _ChunkAggregate(torch.autograd.Function):
    """``Z[c] = Â[c,:] @ Hbuf`` after writing ``h`` into ``Hbuf[c]``; backward pulls
    ``dH[c] = Âᵀ[c,:] @ dZbuf`` after writing the chunk's gradient into ``dZbuf[c]``."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, buf: LayerBuffers, rows: ChunkRows, lo: int, hi: int,
                double: bool, cached: Tensor | None, sync: RowSync | None, key: int,
                chunk: int) -> Tensor:
        ctx.buf, ctx.rows, ctx.lo, ctx.hi, ctx.double = buf, rows, lo, hi, double
        ctx.sync, ctx.key, ctx.chunk = sync, key, chunk
        if cached is not None:  # recomputation: reuse the forward's aggregation, keep its inputs
            return cached.to(h.dtype, copy=True)
        buf.H[lo:hi] = h.detach()
        if sync is not None:
            sync.share_h(key, buf, chunk)
        return rows.A @ buf.H

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        buf = ctx.buf
        buf.dZ[ctx.lo:ctx.hi] = grad
        received = ctx.sync.share_dz(ctx.key, buf, ctx.chunk) if ctx.sync is not None else None
        dh = ctx.rows.AT @ buf.dZ
        if ctx.double:
            buf.dZ[ctx.lo:ctx.hi] *= 2.0
            if received is not None:
                buf.dZ[received] *= 2.0
        return dh, None, None, None, None, None, None, None, None, None


class ChunkContext:
    """Block context for one chunk of one stage."""

    def __init__(self, executor: StageExecutor, chunk: int, epoch: int,
                 cache: dict[int, Tensor] | None, replay: bool) -> None:
        self.ex, self.chunk, self.epoch = executor, chunk, epoch
        self.lo, self.hi = executor.bounds[chunk], executor.bounds[chunk + 1]
        self.training = True
        self.cache, self.replay = cache, replay

    def aggregate(self, h: Tensor, key: int) -> Tensor:
        buf = self.ex.buffers_for(key, h.size(1))
        recompute = self.ex.recompute
        cached = None
        if recompute and self.replay:
            cached = buf.kept(self.lo, self.hi)
        z = _ChunkAggregate.apply(h, buf, self.ex.rows[self.chunk], self.lo, self.hi,
                                  self.ex.techniques.unbiased_grad, cached, self.ex.sync, key,
                                  self.chunk)
        if recompute and not self.replay:
            buf.keep_z(self.lo, self.hi, z.detach(), self.ex.slot_rows)
        return z

    def message_passing(self, module: torch.nn.Module, h: Tensor, key: int) -> Tensor:
        """PyG ``module`` on the edges into this chunk, sources from ``Hbuf``; a pushing
        backward (:mod:`gnnpipe.engine.message_passing`)."""
        return chunk_message_passing(self, module, h, key, lambda: mask_seed(
            self.ex.seed, self.epoch, self.chunk, key + LAYER_RNG_KEY))

    def dropout(self, h: Tensor, p: float, key: int) -> Tensor:
        if p == 0.0:
            return h
        return keyed_dropout(h, p, mask_seed(self.ex.seed, self.epoch, self.chunk, key))


@dataclass
class _Saved:
    inputs: list[Tensor]
    outputs: list[Tensor] = field(default_factory=list)
    cache: dict[int, Tensor] | None = None
    target: tuple[Tensor, Tensor, int] | None = None


class StageExecutor:
    """Runs blocks ``start:stop`` of ``model`` chunk by chunk with historical embeddings.

    Args:
        model: the whole stack (only blocks ``start:stop`` are run; parameters are shared).
        start, stop: the stage's block range.
        adj: normalised adjacency of the chunk-ordered graph.
        bounds: ``C + 1`` row offsets; chunk ``c`` is rows ``bounds[c]:bounds[c+1]``.
        techniques: convergence switches.
        seed: keys dropout masks.
        recompute: keep only stage inputs and aggregation outputs; rerun the forward in backward.
        input_grad: return gradients for the stage's inputs (default: unless it is the first stage).
        sync: shares fresh buffer rows with the other ways (hybrid mode).
        rows: the chunks' rows of ``adj`` (default: built here, gathered on the CPU); executors
            of one process may share them, as one stage's blocks do.
        history_dtype: the dtype ``Hbuf``, its snapshot and ``dZbuf`` are stored in (rows are
            rounded when written; products read them back as the computation's dtype).
        wire_dtype: the dtype a stage's outputs and its inputs' gradients cross a stage boundary
            in: they are returned rounded to it (and kept in the computation's dtype), so the
            one-process engine computes what ranks sending them in it compute.
    """

    def __init__(self, model: LayerStack, start: int, stop: int, adj: Adjacency,
                 bounds: Sequence[int], techniques: Techniques, seed: int,
                 recompute: bool = False, input_grad: bool | None = None,
                 sync: RowSync | None = None,
                 rows: Sequence[ChunkRows] | None = None,
                 history_dtype: torch.dtype = torch.float32,
                 wire_dtype: torch.dtype = torch.float32) -> None:
        self.model, self.start, self.stop = model, start, stop
        self.history_dtype, self.wire_dtype = history_dtype, wire_dtype
        self.input_grad = start > 0 if input_grad is None else input_grad
        self.sync = sync
        self.bounds = [int(b) for b in bounds]
        self.num_nodes, self.device = adj.num_nodes, adj.A.device
        self.rows = list(rows) if rows is not None else chunk_rows(adj, self.bounds)
        if len(self.rows) != len(self.bounds) - 1:
            raise ValueError(f"rows: expected {len(self.bounds) - 1} chunks' rows, got {len(self.rows)}")
        self.message_graphs = None if adj.edge_index is None else MessageGraphs(
            adj.edge_index, self.num_nodes, self.bounds)  # built on a message_passing call
        self.techniques, self.seed, self.recompute = techniques, seed, recompute
        self.is_last = stop == len(model)
        # tensors handed to the next stage: h, plus h0 only while a later block still needs it
        self.num_outputs = 1 if self.is_last else len(model.boundary_widths(stop))
        self.buffers: dict[int, LayerBuffers] = {}
        self.saved: dict[int, _Saved] = {}
        self.epoch = 0
        # A pipeline stage that idles between its last forward and its first backward (every
        # stage but the last) does the buffers' upkeep there (:meth:`between_phases`) instead of
        # at the epoch's start, where the first stage has no time to spare.
        self.upkeep_between_phases = False
        #: Runs after every chunk's forward and backward (a rank under a memory limit trims
        #: its heap there: :class:`~gnnpipe.engine.memory.HeapCeiling`).
        self.after_op: Callable[[], None] | None = None
        #: Rows of a recompute-cache slot (:meth:`LayerBuffers.keep_z`), 0 for a full-graph
        #: cache: an engine running few chunks at a time (1F1B) sets it to the tallest chunk's.
        self.slot_rows = 0
        self._h_ready_for = -1  # the epoch whose starting Hbuf is already in place
        self._snapshot_epoch = -1  # the epoch whose due snapshot is taken
        self._backward_phase = False  # this epoch's backward has begun (between_phases ran)

    @property
    def num_chunks(self) -> int:
        return len(self.rows)

    def cache_in_slots(self) -> None:
        """Keep the recompute cache in a slot per chunk in flight (1F1B: few chunks are),
        instead of a full-graph tensor."""
        self.slot_rows = max(b - a for a, b in zip(self.bounds, self.bounds[1:]))

    def buffers_for(self, key: int, width: int, grad: bool = True,
                    grad_dtype: torch.dtype | None = None) -> LayerBuffers:
        """Block ``key``'s buffers (in :attr:`history_dtype`), allocated on first use; ``dZbuf``
        at once if ``grad``, else when first used; in ``grad_dtype`` where it has memory of its
        own and ``grad_dtype`` is given."""
        buf = self.buffers.get(key)
        if buf is None:
            shape = (self.num_nodes, width)
            def zeros(dtype: torch.dtype | None = None) -> Tensor:
                return torch.zeros(shape, dtype=dtype or self.history_dtype, device=self.device)

            tech = self.techniques
            own_grad = grad and not tech.grad_in_h
            buf = LayerBuffers(zeros(), zeros() if tech.snapshot else None,
                               zeros(grad_dtype) if own_grad else None, grad_in_h=tech.grad_in_h,
                               grad_dtype=grad_dtype)
            self.buffers[key] = buf
        return buf

    def begin_epoch(self, epoch: int) -> None:
        """Reset ``Hbuf`` from the snapshot and zero ``dZbuf`` (technique switches permitting),
        unless :meth:`between_phases` does or did it."""
        self.epoch = epoch
        self.saved.clear()
        self._backward_phase = False
        self.model.train()  # layers with their own dropout (GATConv) read module.training
        if self._h_ready_for != epoch:
            self._reset_h()
        if not self.upkeep_between_phases and not self.techniques.grad_in_h:
            self._zero_dz()

    def between_phases(self) -> None:
        """After the epoch's last forward, before its first backward (which reads ``dZbuf``
        only; :meth:`backward` calls it if the engine has not). With ``grad_in_h``: take the
        snapshot due at this epoch's end, then zero ``Hbuf``'s memory, the backward's
        ``dZbuf``. Else, with ``upkeep_between_phases`` (a stage that idles here): zero
        ``dZbuf``, take the due snapshot and reset ``Hbuf`` for the next epoch; the same values
        as at the epoch's ends."""
        if self._backward_phase:
            return
        self._backward_phase = True
        if self.techniques.grad_in_h:
            self._take_due_snapshot()
            self._zero_dz()
        elif self.upkeep_between_phases:
            self._zero_dz()
            if self.techniques.snapshot:
                if not self._take_due_snapshot():  # else Hbuf equals the snapshot already
                    self._reset_h()
                self._h_ready_for = self.epoch + 1

    def end_epoch(self) -> None:
        self._take_due_snapshot()

    def buffer_state(self) -> dict[str, dict[str, Tensor]]:
        """The stage's historical buffers by block key (``H``; ``dZ`` and ``snap`` if
        allocated), on the CPU: this executor's part of a checkpoint shard."""
        return {str(key): {k: v.cpu().clone() for k, v in buf.tensors().items()}
                for key, buf in self.buffers.items()}

    def load_buffer_state(self, shards: list[dict[str, Any]], layout: dict[str, Any]) -> None:
        """Take the historical buffers of the stage's blocks from a checkpoint's ``shards`` where
        they carry over exactly: the same node order and chunking, and either one pipeline per
        stage (``local``, ``pipeline``) or the same ranks (``hybrid`` resumed as itself). Buffers
        that do not carry over start from zeros like epoch 0 (a logged warning)."""
        for s in shards:
            old = s["layout"]
            if old.get("node_order") != layout["node_order"]:
                continue
            same_ranks = all(old.get(k) == layout[k] for k in ("mode", "ranges", "ways", "rank"))
            if old.get("ways", 1) != 1 and not same_ranks:
                continue
            for key, tensors in s["buffers"].items():
                k = int(key)
                if self.start <= k < self.stop and ("snap" in tensors) == self.techniques.snapshot:
                    self.buffers[k] = self._loaded(tensors)
        blocks = self.model.blocks
        fresh = [k for k in range(self.start, self.stop)
                 if blocks[k].aggregates and k not in self.buffers]
        if fresh:
            logger.warning("resume: the historical buffers of blocks %s start from zeros like "
                           "epoch 0 (the checkpoint's node order, chunking or stage layout "
                           "differs)", fresh)

    def _loaded(self, tensors: dict[str, Tensor]) -> LayerBuffers:
        """One block's buffers from a checkpoint, in this run's :attr:`history_dtype` (a
        ``dZbuf`` kept in another dtype than its ``Hbuf``, a message-passing layer's exact
        ``Gbuf``, keeps its own)."""
        def on(t: Tensor, dtype: torch.dtype) -> Tensor:
            return t.to(self.device, dtype).clone()

        stored = tensors["H"].dtype
        snap = tensors.get("snap")
        grad = None if self.techniques.grad_in_h else tensors.get("dZ")  # else restarts in Hbuf
        grad_dtype = None if grad is None or grad.dtype == stored else grad.dtype
        return LayerBuffers(on(tensors["H"], self.history_dtype),
                            None if snap is None else on(snap, self.history_dtype),
                            None if grad is None else on(grad, grad_dtype or self.history_dtype),
                            self.techniques.grad_in_h, grad_dtype=grad_dtype)

    def _take_due_snapshot(self) -> bool:
        """Copy ``Hbuf`` into the snapshot if one is due at this epoch's end and not yet taken;
        whether it was taken now."""
        t = self.techniques
        if not t.snapshot or not t.snapshot_due(self.epoch) or self._snapshot_epoch == self.epoch:
            return False
        for buf in self.buffers.values():
            assert buf.snap is not None  # buffers have a snapshot when snapshots are on
            buf.snap.copy_(buf.H)
        self._snapshot_epoch = self.epoch
        return True

    def _reset_h(self) -> None:
        for buf in self.buffers.values():
            if buf.snap is not None:
                buf.H.copy_(buf.snap)

    def _zero_dz(self) -> None:
        if self.techniques.unbiased_grad:
            for buf in self.buffers.values():
                buf.zero_grad()

    def _run(self, chunk: int, inputs: list[Tensor], cache: dict[int, Tensor] | None,
             replay: bool, target: tuple[Tensor, Tensor, int] | None) -> list[Tensor]:
        ctx = ChunkContext(self, chunk, self.epoch, cache, replay)
        h, h0 = self.model.run(inputs[0], ctx, self.start, self.stop,
                               inputs[1] if len(inputs) > 1 else None)
        if target is not None:
            y, mask, num_train = target
            return [chunk_loss(h, y, mask, num_train)]
        return [h, h0][:self.num_outputs] if h0 is not None else [h]

    def forward(self, chunk: int, inputs: list[Tensor],
                target: tuple[Tensor, Tensor, int] | None = None) -> list[Tensor]:
        """Forward one chunk. ``inputs`` is ``[h]`` or ``[h, h0]``; the last stage gets ``target``
        ``(y rows, train-mask rows, total training nodes)`` and returns ``[loss]``.
        Returns detached outputs (to send on); the graph is kept for :meth:`backward`."""
        if self._backward_phase and self.techniques.grad_in_h:
            raise RuntimeError("StageExecutor.forward: this epoch's backward has begun and "
                               "Hbuf's memory holds dZbuf now (Techniques.grad_in_h); run every "
                               "forward of an epoch before its first backward")
        leaves = [t.detach().requires_grad_(t.is_floating_point() and self.input_grad) for t in inputs]
        cache: dict[int, Tensor] | None = {} if self.recompute else None
        grad_mode = torch.no_grad() if self.recompute else torch.enable_grad()
        with grad_mode:
            outputs = self._run(chunk, leaves, cache, replay=False, target=target)
        self.saved[chunk] = _Saved(leaves, [] if self.recompute else outputs, cache, target)
        self._after_op()
        if self.is_last:
            return [o.detach() for o in outputs]
        return [self._on_wire(o.detach()) for o in outputs]

    def backward(self, chunk: int,
                 grads: Sequence[Tensor | None] | None = None) -> list[Tensor | None]:
        """Backward one chunk from the gradients of its outputs (``None`` on the last stage);
        returns the gradients of its inputs (``None`` where an input needs none)."""
        self.between_phases()  # a no-op once it ran this epoch
        saved = self.saved.pop(chunk)
        outputs = saved.outputs
        if self.recompute:
            outputs = self._run(chunk, saved.inputs, saved.cache, replay=True, target=saved.target)
        pairs: list[tuple[Tensor, Tensor | None]]
        if grads is None:
            pairs = [(outputs[0], None)]
        else:
            pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        sent = [self._on_wire(t.grad) if t.requires_grad and t.grad is not None else None
                for t in saved.inputs]
        del saved, outputs, pairs  # the chunk's tensors go before the hook looks at memory
        self._after_op()
        return sent

    def _after_op(self) -> None:
        if self.after_op is not None:
            self.after_op()

    def _on_wire(self, t: Tensor) -> Tensor:
        """``t`` rounded to :attr:`wire_dtype`, in its own dtype (itself when they agree)."""
        if t.dtype == self.wire_dtype or not t.is_floating_point():
            return t
        return t.to(self.wire_dtype).to(t.dtype)
