"""`TrainConfig`: the one typed description of a training job, and `Launch`, what one launch
of it adds.

``gp.train`` (and the CLI, through it) checks its arguments once, at the API door
(:mod:`gnnpipe.api.door`), and builds a ``TrainConfig``: the mode as a :class:`Mode`, the layout
resolved (stages, stage ranges, chunks, ways, parts), the techniques as a :class:`Techniques`.
Every layer below reads its attributes; nothing checks, defaults or changes them again. A run's
``config.json``, each checkpoint manifest and the dashboard's replay hold it as
:meth:`TrainConfig.to_dict` (with :data:`CONFIG_VERSION`) and read it back with
:meth:`TrainConfig.from_dict`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from gnnpipe.core.kinds import Mode, Precision, TrainSchedule
from gnnpipe.core.techniques import Techniques

__all__ = ["CONFIG_VERSION", "LEGACY_PARTS_PER_CHUNK", "PARTS_PER_CHUNK", "Launch", "TrainConfig"]

#: Version of :meth:`TrainConfig.to_dict`'s layout; dicts without one are from before it.
CONFIG_VERSION = 1

#: METIS parts merged into each chunk by default: METIS's own parts, the fewest edges between
#: chunks.
PARTS_PER_CHUNK = 1
#: What runs saved before ``parts_per_chunk`` existed were chunked with (the GNNPipe paper's
#: merge of 4 METIS parts per chunk).
LEGACY_PARTS_PER_CHUNK = 4

Range = tuple[int, int]


@dataclass(frozen=True)
class TrainConfig:
    """A training job, checked and resolved (``gp.train``'s arguments, attribute for attribute).

    Attributes:
        mode: how the job trains.
        model: the model's name (``"gcnii"``, ``"custom"``, ...); ``layers`` its GNN layers.
        epochs, lr, weight_decay, gnn_weight_decay, seed, eval_every: as ``gp.train`` takes them.
        stages: pipeline stages per way (1 in ``single`` and ``graph``).
        ranges: each stage's block range ``[start, stop)``; together they tile the model.
        chunks: chunks per epoch (1 in ``single`` and ``graph``).
        parts_per_chunk: METIS parts merged into each chunk.
        ways: pipelines side by side (``hybrid``); parts: METIS partitions (``graph``).
        techniques: GNNPipe's convergence techniques; recompute: rerun the forward in backward.
        history_dtype: what the historical buffers are stored in (products run in float32).
        wire_dtype: what stage-boundary activations and gradients and graph-parallel halo rows
            are sent (and, in ``local``, rounded) in.
        schedule: the order of a chunked epoch's forwards and backwards
            (:class:`~gnnpipe.core.kinds.TrainSchedule`).
        dataset: the graph's name where it has one (a saved run's replay reloads it).
        device: ``"cpu"`` or ``"cuda"``; timeout: seconds a rank waits on a peer.
        checkpoint, checkpoint_every, restarts, resume: where and how often it checkpoints,
            how often it restarts, and the checkpoint folder it resumed (``None``: none).
    """

    mode: Mode
    model: str
    layers: int
    epochs: int
    lr: float
    weight_decay: float
    gnn_weight_decay: float | None
    seed: int
    stages: int
    ranges: tuple[Range, ...]
    chunks: int
    parts_per_chunk: int
    ways: int
    parts: int
    techniques: Techniques
    recompute: bool
    dataset: str | None
    eval_every: int = 1
    device: str = "cpu"
    timeout: float = 120.0
    checkpoint: str | None = None
    checkpoint_every: int | None = None
    restarts: int = 0
    resume: str | None = None
    history_dtype: Precision = Precision.FLOAT32
    wire_dtype: Precision = Precision.FLOAT32
    schedule: TrainSchedule = TrainSchedule.GNNPIPE

    @property
    def world(self) -> int:
        """Ranks of a distributed run (``parts`` in ``graph``, ``ways × stages`` else); 1 for
        one-process modes."""
        if not self.mode.distributed:
            return 1
        return self.parts if self.mode is Mode.GRAPH else self.stages * self.ways

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, with ``version``."""
        out = asdict(self)
        out.update(version=CONFIG_VERSION, mode=self.mode.value,
                   ranges=[list(r) for r in self.ranges], history_dtype=self.history_dtype.value,
                   wire_dtype=self.wire_dtype.value, schedule=self.schedule.value)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        """Read :meth:`to_dict`'s output back, also from a run saved before the version field
        (missing fields take their defaults; a missing ``parts_per_chunk`` is the merge such runs
        were chunked with, :data:`LEGACY_PARTS_PER_CHUNK`). Unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in names}
        values.setdefault("parts_per_chunk", LEGACY_PARTS_PER_CHUNK)
        for name, default in (("model", "?"), ("layers", 0), ("epochs", 0), ("lr", 0.0),
                              ("weight_decay", 0.0), ("gnn_weight_decay", None), ("seed", 0),
                              ("stages", 1), ("chunks", 1), ("ways", 1), ("parts", 1),
                              ("recompute", False), ("dataset", None), ("ranges", ())):
            values.setdefault(name, default)
        values["mode"] = Mode.parse("mode", raw.get("mode"))
        values["ranges"] = tuple((int(a), int(b)) for a, b in values["ranges"])
        for name in ("history_dtype", "wire_dtype"):
            values[name] = Precision.of(name, raw.get(name, "float32"))
        values["schedule"] = TrainSchedule.parse("schedule", raw.get("schedule", "gnnpipe"))
        values["techniques"] = Techniques.coerce(raw.get("techniques", True))  # older: all on
        return cls(**values)


@dataclass(frozen=True)
class Launch:
    """What starting a distributed job adds to its :class:`TrainConfig`: the run's id (its Dask
    topic, which a dashboard on another client follows), the bytes per epoch
    ``gp.comm_volume`` predicts for it and ``plan_memory_limit``, the bytes each rank may add to
    what its worker holds once the graph has arrived: the ``memory_limit`` of the plan it trains
    (None: none; not the workers' Dask ``memory_limit``), under which its ranks trim their
    heap."""

    run_id: str
    predicted_comm_bytes: int
    plan_memory_limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Launch | None:
        """The launch fields of a saved ``config.json``, or None for a one-process run."""
        if raw.get("run_id") is None:
            return None
        limit = raw.get("plan_memory_limit")
        return cls(str(raw["run_id"]), int(raw.get("predicted_comm_bytes") or 0),
                   None if limit is None else int(limit))
