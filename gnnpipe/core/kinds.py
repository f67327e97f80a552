"""Names with meaning, as ``str`` enums: training modes, timeline op kinds and block kinds.

Each member *is* its string (``Mode.PIPELINE == "pipeline"``), so old strings keep working at
the API door, in saved runs and in DataFrame columns, while code below the door compares
members and a type checker sees which values a field may hold.
"""

from __future__ import annotations

from enum import Enum

from typing_extensions import Self

__all__ = ["BlockKind", "Mode", "OpKind", "Precision", "StrEnum", "TrainSchedule"]


class StrEnum(str, Enum):
    """A ``str`` enum that prints, formats, serialises and reprs as its value (so messages and
    op keys such as ``('backward', 1, 2, 0)`` read as they did with plain strings)."""

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def parse(cls, name: str, value: object) -> Self:
        """``value`` as a member, or ``ValueError: name: expected one of (...), got value``."""
        try:
            return cls(value)
        except ValueError:
            options = tuple(m.value for m in cls)
            raise ValueError(f"{name}: expected one of {options}, got {value!r}") from None


class Mode(StrEnum):
    """How a job trains: ``single`` (exact full graph, one process), ``local`` (GNNPipe's
    chunked epoch in one process), and on Dask workers ``pipeline`` (one stage per rank),
    ``graph`` (one METIS partition per rank) and ``hybrid`` (``ways`` pipelines side by side)."""

    SINGLE = "single"
    LOCAL = "local"
    PIPELINE = "pipeline"
    GRAPH = "graph"
    HYBRID = "hybrid"

    @property
    def distributed(self) -> bool:
        """Runs its ranks on Dask workers."""
        return self in (Mode.PIPELINE, Mode.GRAPH, Mode.HYBRID)

    @property
    def chunked(self) -> bool:
        """Trains with GNNPipe's chunked epoch (historical embeddings)."""
        return self in (Mode.LOCAL, Mode.PIPELINE, Mode.HYBRID)

    @property
    def staged(self) -> bool:
        """Splits the model into pipeline stages."""
        return self in (Mode.LOCAL, Mode.PIPELINE, Mode.HYBRID)


class OpKind(StrEnum):
    """What a timeline row or a schedule op does. In zero-bubble schedules ``backward`` is the
    input gradient and ``weight`` the weight gradient; ``idle`` is a timeline-only kind."""

    FORWARD = "forward"
    BACKWARD = "backward"
    WEIGHT = "weight"
    SEND = "send"
    RECV = "recv"
    ALLREDUCE = "allreduce"
    STEP = "step"
    IDLE = "idle"


class BlockKind(StrEnum):
    """A block's place in a stack: ``input`` projection, ``gnn`` layer or ``output``
    classifier (weight-decay groups and reports)."""

    INPUT = "input"
    GNN = "gnn"
    OUTPUT = "output"


class Precision(StrEnum):
    """A floating-point storage format by torch's name for it: what the historical buffers are
    kept in (``history_dtype``). Arithmetic stays in ``float32`` whatever the storage."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def itemsize(self) -> int:
        """Bytes per value."""
        return 4 if self is Precision.FLOAT32 else 2

    @classmethod
    def of(cls, name: str, value: object) -> Precision:
        """``value`` (a member, its name, or a torch dtype such as ``torch.bfloat16``, whose
        ``str`` is ``"torch.bfloat16"``) as a member, or ``ValueError`` naming ``name``."""
        text = str(value)
        for member in cls:
            if text in (member.value, f"torch.{member.value}"):
                return member
        options = tuple(m.value for m in cls)
        raise ValueError(f"{name}: expected a torch dtype or name of {options}, got {value!r}")


class TrainSchedule(StrEnum):
    """The order a chunked epoch runs its chunks' forwards and backwards on each stage.

    ``gnnpipe`` (GNNPipe's fill-drain): every forward of the epoch in chunk order, then every
    backward in reverse order; a chunk's backward pulls this epoch's gradients of the chunks after
    it, and a stage keeps all ``C`` chunks' activations until its backward phase. ``1f1b``
    (PipeDream-flush order): each chunk's backward follows as soon as the last stage has its loss,
    backwards in chunk order; stage ``s`` keeps at most ``S - s`` chunks in flight and its
    forward and backward overlap other stages' work, but a chunk's backward pulls last epoch's
    gradients of the chunks after it (a different training rule: its accuracy is measured in
    ``benchmarks/schedule_accuracy.py``).
    """

    GNNPIPE = "gnnpipe"
    ONE_F_ONE_B = "1f1b"
