"""`Prediction`: what a plan predicted for the layout a run trains, carried by the run so that
its summary and dashboard put the measured figures beside the predicted ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["CANDIDATE_COLUMNS", "Prediction"]

#: The columns of a plan's candidate table (``plan.table()``), in this order.
CANDIDATE_COLUMNS = ("layout", "mode", "stages", "ways", "parts", "chunks", "ranges", "schedule",
                     "recompute", "history_dtype", "wire_dtype", "workers", "epoch_time",
                     "peak_bytes", "rank_peak_bytes", "comm_bytes", "fits", "chosen", "reason")


@dataclass(frozen=True, eq=False)
class Prediction:
    """A plan's prediction for its chosen layout.

    Attributes:
        layout: the chosen layout's name (``"pipeline 2 x 8 (1f1b)"``).
        epoch_time: predicted seconds per training epoch.
        peak_bytes: predicted peak memory of each rank (one entry in one-process modes).
        comm_bytes: predicted bytes sent per epoch (``gp.comm_volume``).
        candidates: every layout the plan weighed (:data:`CANDIDATE_COLUMNS`).
        memory_limit: the bytes per rank the plan was made under (None: none).
    """

    layout: str
    epoch_time: float
    peak_bytes: tuple[int, ...]
    comm_bytes: int
    candidates: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=list(CANDIDATE_COLUMNS)))
    memory_limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values."""
        return {"layout": self.layout, "epoch_time": self.epoch_time,
                "peak_bytes": list(self.peak_bytes), "comm_bytes": self.comm_bytes,
                "candidates": self.candidates.to_dict("records"),
                "memory_limit": self.memory_limit}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Prediction:
        """:meth:`to_dict`'s values back."""
        limit = raw.get("memory_limit")
        return cls(str(raw["layout"]), float(raw["epoch_time"]),
                   tuple(int(b) for b in raw["peak_bytes"]), int(raw["comm_bytes"]),
                   pd.DataFrame(raw.get("candidates", []),
                                columns=list(CANDIDATE_COLUMNS)),
                   None if limit is None else int(limit))
