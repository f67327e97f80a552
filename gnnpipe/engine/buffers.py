"""A stage's full-graph state for the chunked epoch: each aggregating block's ``Hbuf``, its
snapshot and ``dZbuf`` (:class:`LayerBuffers`, stored in a :class:`~gnnpipe.core.kinds.Precision`),
the rows of them other chunks read (:func:`boundary_rows`), and the hook that shares fresh rows
with the hybrid's other ways (:class:`RowSync`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from gnnpipe.core.kinds import Precision
from gnnpipe.engine.graph import Adjacency

__all__ = ["LayerBuffers", "RowSync", "boundary_rows", "torch_dtype"]


def torch_dtype(precision: Precision) -> torch.dtype:
    """The torch dtype of a storage :class:`~gnnpipe.core.kinds.Precision`."""
    dtype = getattr(torch, precision.value)
    assert isinstance(dtype, torch.dtype)
    return dtype



@dataclass
class LayerBuffers:
    """Full-graph state of one aggregating block: ``Hbuf``, its snapshot and ``dZbuf``.

    ``dZbuf`` is allocated on first use: a layer whose input needs no gradient (a first layer
    reading the features, possibly thousands wide) never has one. With ``grad_in_h`` it is
    ``Hbuf``'s own memory, zeroed when the backward phase begins
    (:attr:`Techniques.grad_in_h`)."""

    H: Tensor
    snap: Tensor | None
    grad: Tensor | None = None
    grad_in_h: bool = False
    #: ``dZbuf``'s dtype where it has memory of its own (None: ``Hbuf``'s)
    grad_dtype: torch.dtype | None = None
    #: Recomputation's copy of the forward's aggregation outputs ``Z``, rows by chunk: one
    #: full-size tensor kept across epochs, not a tensor per chunk allocated every epoch
    #: (those fragment the heap, and a rank's resident memory grew epoch after epoch), in the
    #: history's dtype (a 16-bit history halves it; the replay then reads ``Z`` rounded, as the
    #: products read ``Hbuf``). Not part of a checkpoint.
    kept_z: Tensor | None = None
    #: The same copy when chunks are few in flight (1F1B): a slot per chunk between its forward
    #: and its backward, each as tall as the tallest chunk, reused across chunks and epochs.
    z_slots: list[Tensor] = field(default_factory=list)
    #: Which slot holds the chunk starting at each row (the chunks in flight).
    z_slot_of: dict[int, int] = field(default_factory=dict)

    @property
    def dZ(self) -> Tensor:
        """``dZbuf`` (for message-passing layers, ``Gbuf``), zeros when first used."""
        if self.grad_in_h:
            return self.H
        if self.grad is None:
            self.grad = torch.zeros_like(self.H, dtype=self.grad_dtype or self.H.dtype)
        return self.grad

    def zero_grad(self) -> None:
        """Zero ``dZbuf`` if it exists."""
        grad = self.H if self.grad_in_h else self.grad
        if grad is not None:
            grad.zero_()

    def keep_z(self, lo: int, hi: int, z: Tensor, slot_rows: int = 0) -> None:
        """Keep ``z``, the forward's ``Z[lo:hi]``, for the replay: in :attr:`kept_z`, or with
        ``slot_rows`` (the tallest chunk's rows) in a free slot of :attr:`z_slots`."""
        if not slot_rows:
            if self.kept_z is None:  # stored as the history is: compact with a 16-bit history
                self.kept_z = torch.empty_like(self.H)
            self.kept_z[lo:hi] = z
            return
        taken = set(self.z_slot_of.values())
        free = next((k for k in range(len(self.z_slots)) if k not in taken), None)
        if free is None:
            free = len(self.z_slots)
            self.z_slots.append(self.H.new_empty(slot_rows, self.H.size(1)))
        self.z_slots[free][:hi - lo] = z
        self.z_slot_of[lo] = free

    def kept(self, lo: int, hi: int) -> Tensor:
        """The forward's ``Z[lo:hi]`` kept for the replay; a slot is free again once read."""
        if lo in self.z_slot_of:
            return self.z_slots[self.z_slot_of.pop(lo)][:hi - lo]
        assert self.kept_z is not None, "the forward keeps Z for its replay (keep_z)"
        return self.kept_z[lo:hi]

    def tensors(self) -> dict[str, Tensor]:
        """The buffers allocated so far, by name (``H``, ``dZ``, ``snap``; ``dZ`` only where it
        has memory of its own)."""
        named = {"H": self.H, "dZ": self.grad, "snap": self.snap}
        return {k: v for k, v in named.items() if v is not None}


def _rows_reaching_outside(part: Tensor, lo: int, hi: int) -> Tensor:
    """Global ids of the rows of CSR ``part`` (rows ``lo:hi``) with a column outside ``lo:hi``."""
    cols = part.col_indices()
    row = torch.repeat_interleave(torch.arange(hi - lo), part.crow_indices().diff())
    return torch.unique(row[(cols < lo) | (cols >= hi)]) + lo


def boundary_rows(adj: Adjacency, bounds: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Per chunk, the rows other chunks read: forward ``Hbuf`` rows (``Â[r, i] != 0`` for some
    ``r`` outside, i.e. ``Âᵀ`` rows reaching outside) and backward ``dZbuf`` rows (``Â`` rows).
    The hybrid's ways exchange exactly these (and :mod:`gnnpipe.analysis.volume` counts them)."""
    forward, backward = [], []
    for c in range(len(bounds) - 1):
        lo, hi = bounds[c], bounds[c + 1]
        rows = adj.rows(lo, hi)
        forward.append(_rows_reaching_outside(rows.AT, lo, hi))
        backward.append(_rows_reaching_outside(rows.A, lo, hi))
    return forward, backward


class RowSync(Protocol):
    """Hook that shares freshly written buffer rows with other holders of the same stage (the
    hybrid mode's ways). Local and pipeline modes use none."""

    def share_h(self, key: int, buf: LayerBuffers, chunk: int) -> None: ...

    def share_dz(self, key: int, buf: LayerBuffers, chunk: int) -> Tensor | None:
        """Returns the row ids received, which the unbiased technique doubles with the chunk's."""

    def share_pushed(self, key: int, chunk: int, grad: Tensor,
                     rows_of: Callable[[int], int]) -> dict[int, Tensor]:
        """A message-passing layer's push (gradients for the rows of other chunks that ``chunk``
        reads) out, the other ways' pushes in, by their chunk; ``rows_of(c)`` is the row count
        of chunk ``c``'s push."""
