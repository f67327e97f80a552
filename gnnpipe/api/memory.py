"""``gp.estimate_memory``: every rank's peak memory for a job, before running it."""

from __future__ import annotations

import inspect
from typing import Any

import pandas as pd
from torch_geometric.data import Data

from gnnpipe.analysis.memory import estimate
from gnnpipe.api import door
from gnnpipe.api.train import train
from gnnpipe.pyg import for_training

__all__ = ["estimate_memory"]

_TRAIN_DEFAULTS = {name: p.default for name, p in inspect.signature(train).parameters.items()
                   if p.default is not inspect.Parameter.empty and name != "mode"}


def estimate_memory(model: Any, data: Data, mode: str | None = None,
                    **options: Any) -> pd.DataFrame:
    """Predict each rank's peak memory for ``gp.train(model, data, mode, **options)``, itemised,
    without training or a cluster (``mode``: as ``gp.train`` takes it, default ``"single"`` or
    the plan's).

    Takes ``gp.train``'s keyword arguments (``stages``, ``chunks``, ``ways``, ``parts``,
    ``recompute``, ``history_dtype``, ``wire_dtype``, ``techniques``, ``plan``, ...), checked as
    ``gp.train`` checks them; those that do not change memory (``epochs``, ``lr``, the cluster)
    are accepted and ignored. The model's blocks are measured on a small random graph shaped like
    ``data`` (a few seconds); the graph's own sizes — chunks, halos, edges — come from ``data``
    (METIS runs on it as the run would).

    Returns:
        One row per rank, in order (the index is the rank too), columns ``rank`` (as in
        ``run.memory()``), ``stage``, the items of :mod:`gnnpipe.analysis.memory`
        (``parameters``, ``features``, ``adjacency``, ``history``, ``recompute_cache``,
        ``runtime``, ``stash``, ``working``, ``communication``, ``evaluation``) and
        ``peak_bytes``, all in bytes; ``single`` and ``local`` have rank 0. Compare it with
        ``run.memory()["peak_bytes"]`` of the run.

    Raises:
        TypeError: an option ``gp.train`` does not take.
        ValueError, TypeError: a bad value, named as ``gp.train`` names it.
    """
    unknown = sorted(set(options) - set(_TRAIN_DEFAULTS))
    if unknown:
        raise TypeError(f"estimate_memory: unexpected option(s) {unknown}; expected gp.train's "
                        "keyword arguments")
    given = {name: options.pop(name, None) for name in door.LAYOUT_DEFAULTS}
    mode, layout = door.resolve_layout(options.get("plan"), mode, given)
    args = {**_TRAIN_DEFAULTS, **options, **layout}
    model = for_training(model, mode, data)
    job, data, _, _ = door.parse_train(model, data, mode, **args)
    return estimate(model, data, job)
