"""All tensor traffic between ranks goes through `Comm`: torch.distributed point-to-point and
collectives, with bytes counted per (src, dst, kind) and every op recorded as a Timeline row."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from gnnpipe.core.kinds import OpKind
from gnnpipe.core.timeline import OpEvent

__all__ = ["TRAINING_KINDS", "Comm", "PendingRecv"]

#: Byte kinds that count towards the per-epoch training volume (docs/design.md §5 formulas).
TRAINING_KINDS = ("activation", "gradient", "halo", "halo_grad", "boundary", "boundary_grad")


def _started(work: dist.Work | None) -> dist.Work:
    """The handle of a point-to-point op just started; torch gives None only to a rank outside
    the process group, which a gnnpipe rank never is."""
    if work is None:
        raise RuntimeError("torch.distributed: this rank is not in the default process group")
    return work


@dataclass
class PendingRecv:
    """A receive in flight (:meth:`Comm.post_recv`)."""

    comm: Comm
    work: dist.Work
    out: Tensor
    chunk: int
    src: int

    def wait(self) -> Tensor:
        """The received tensor; the Timeline's ``recv`` row spans the wait for it."""
        start = self.comm.now()
        self.work.wait()
        self.comm.record(OpKind.RECV, start, self.chunk, self.out.numel() * self.out.element_size(),
                         self.src)
        return self.out


@dataclass
class Comm:
    """One rank's communicator.

    Args:
        rank, world: this rank and the number of ranks.
        stage, way: where this rank sits (recorded in its Timeline rows).
        origin: ``time.perf_counter()`` value that is time zero on this rank (rank 0's, on its
            host; see ``rank._shared_origin``).
        device: where received and control tensors live (the rank's GPU under NCCL).
    """

    rank: int
    world: int
    stage: int = 0
    way: int = 0
    origin: float = 0.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    epoch: int = 0
    bytes_by: dict[tuple[int, int, str], int] = field(default_factory=lambda: defaultdict(int))
    epoch_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    events: list[OpEvent] = field(default_factory=list)
    # ops in flight: handle, start, kind, chunk, bytes, peer, and the tensor kept alive until done
    _pending: list[tuple[dist.Work, float, OpKind, int, int, int, Tensor]] = field(
        default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def record(self, kind: OpKind, start: float, chunk: int = -1, nbytes: int = 0,
               peer: int = -1) -> None:
        """A Timeline row for an op that began at ``start`` and ends now (on a GPU: once the
        kernels queued so far have finished, so the row spans the work, not its launch)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.events.append(OpEvent(self.rank, self.stage, self.way, chunk, self.epoch, kind,
                                   start, self.now(), nbytes, peer))

    def _count(self, dst: int, kind: str, tensor: Tensor) -> int:
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_by[(self.rank, dst, kind)] += nbytes
        if kind in TRAINING_KINDS:
            self.epoch_bytes[self.epoch] += nbytes
        return nbytes

    def isend(self, tensor: Tensor, dst: int, kind: str, chunk: int = -1) -> dist.Work:
        """Start sending ``tensor`` to ``dst``; completed by :meth:`wait_all` (or
        :meth:`settle`, given the handle returned)."""
        tensor = tensor.contiguous()
        nbytes = self._count(dst, kind, tensor)
        start = self.now()
        work = _started(dist.isend(tensor, dst))
        self._pending.append((work, start, OpKind.SEND, chunk, nbytes, dst, tensor))
        return work

    def recv(self, shape: tuple[int, ...], src: int, chunk: int = -1,
             dtype: torch.dtype = torch.float32) -> Tensor:
        """Receive a tensor of ``shape`` from ``src`` (blocking; the wait is recorded)."""
        out = torch.empty(shape, dtype=dtype, device=self.device)
        start = self.now()
        dist.recv(out, src)
        self.record(OpKind.RECV, start, chunk, out.numel() * out.element_size(), src)
        return out

    def post_recv(self, shape: tuple[int, ...], src: int, chunk: int = -1,
                  dtype: torch.dtype = torch.float32) -> PendingRecv:
        """Start receiving now (so the transfer overlaps this rank's compute); the tensor is
        ready after :meth:`PendingRecv.wait`, which records only the time spent blocked."""
        out = torch.empty(shape, dtype=dtype, device=self.device)
        return PendingRecv(self, _started(dist.irecv(out, src)), out, chunk, src)

    def irecv(self, shape: tuple[int, ...], src: int, chunk: int = -1,
              dtype: torch.dtype = torch.float32) -> Tensor:
        """Start receiving into a new tensor; valid after :meth:`wait_all`."""
        out = torch.empty(shape, dtype=dtype, device=self.device)
        start = self.now()
        self._pending.append((_started(dist.irecv(out, src)), start, OpKind.RECV, chunk,
                              out.numel() * out.element_size(), src, out))
        return out

    def wait_all(self) -> None:
        """Wait for every pending send and receive, recording each."""
        for work, start, kind, chunk, nbytes, peer, _ in self._pending:
            work.wait()
            self.record(kind, start, chunk, nbytes, peer)
        self._pending.clear()

    def settle(self, works: list[dist.Work]) -> None:
        """Wait for, record and release the sends ``works``, which the caller knows have arrived
        (their receiver has answered since): their tensors are freed now instead of at
        :meth:`wait_all`. Gloo's send handles report completion only once waited for, so
        :meth:`reap` never frees them."""
        settled = {id(w) for w in works}
        keep = []
        for item in self._pending:
            work, start, kind, chunk, nbytes, peer, _ = item
            if id(work) in settled:
                work.wait()
                self.record(kind, start, chunk, nbytes, peer)
            else:
                keep.append(item)
        self._pending = keep

    def reap(self) -> None:
        """Record and release the pending sends and receives that have completed (the rest stay
        pending for :meth:`wait_all`; a Gloo send is never seen completed here)."""
        keep = []
        for item in self._pending:
            work, start, kind, chunk, nbytes, peer, _ = item
            if work.is_completed():
                work.wait()
                self.record(kind, start, chunk, nbytes, peer)
            else:
                keep.append(item)
        self._pending = keep

    def allreduce(self, tensors: list[Tensor], kind: str = "allreduce",
                  group: dist.ProcessGroup | None = None) -> None:
        """Sum ``tensors`` in place over all ranks of ``group`` (flattened into one buffer)."""
        size = self.world if group is None else dist.get_world_size(group)
        if size == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        start = self.now()
        dist.all_reduce(flat, group=group)
        nbytes = flat.numel() * flat.element_size()
        self.bytes_by[(self.rank, -1, kind)] += nbytes
        self.record(OpKind.ALLREDUCE, start, nbytes=nbytes)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def broadcast_flag(self, flag: bool, src: int = 0) -> bool:
        """Share one boolean decision of ``src`` with every rank (e.g. stop now)."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        dist.broadcast(value, src)
        self.bytes_by[(src, -1, "control")] += 4 if self.rank == src else 0
        return bool(value.item())

    def comm_table(self) -> list[dict]:
        return [{"src": s, "dst": d, "kind": k, "bytes": b} for (s, d, k), b in self.bytes_by.items()]
