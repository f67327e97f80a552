"""gnnpipe: deep GNN training on whole graphs with GNNPipe's layer pipeline, graph parallelism
and their hybrid, on Dask workers.

The package is a stack of layers; a module imports only from the layers below it (``make
lint`` checks it; ``docs/design.md`` §2 explains each)::

    cli                          the ``gnnpipe`` command
    api | models                 gp.train's door (one TrainConfig per job); the model zoo
    plan                         profile, choose stage boundaries and chunks
    runtime                      Dask clusters, ranks, one program per Mode, DistributedRun
    run                          Run and the RunHandle protocol
    analysis                     comm_volume, parallel efficiency, what-if schedules
    pyg                          PyG models as LayerStacks
    engine                       the math of one epoch (exact, chunked), the epoch driver
    checkpoint                   shards, manifests, resume and restarts
    nn | schedule | partition    blocks and stacks; schedules and their simulator; chunks
    datasets                     graphs, splits, safe loading
    core                         checks, Mode and other enums, Techniques, Timeline,
                                 TrainConfig (no torch)

The names below load on first use (PEP 562), so ``import gnnpipe`` (and ``gnnpipe --help``)
does not import torch; ``dir(gnnpipe)`` lists them."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

#: Where each public name lives; the three submodules are public as modules.
_HOMES = {
    "Cluster": "gnnpipe.runtime.cluster",
    "Mode": "gnnpipe.core.kinds",
    "Partitioning": "gnnpipe.partition",
    "Plan": "gnnpipe.plan",
    "Run": "gnnpipe.run",
    "RunHandle": "gnnpipe.run",
    "Techniques": "gnnpipe.core.techniques",
    "Timeline": "gnnpipe.core.timeline",
    "TrainConfig": "gnnpipe.core.job",
    "chunk": "gnnpipe.partition",
    "comm_volume": "gnnpipe.analysis.volume",
    "estimate_memory": "gnnpipe.api.memory",
    "partition": "gnnpipe.partition",
    "plan": "gnnpipe.plan",
    "simulate": "gnnpipe.schedule.simulator",
    "train": "gnnpipe.api.train",
}
_SUBMODULES = ("datasets", "models", "schedule")

__all__ = [
    "Cluster", "Mode", "Partitioning", "Plan", "Run", "RunHandle", "Techniques", "Timeline",
    "TrainConfig", "__version__", "chunk", "comm_volume", "datasets", "estimate_memory", "models",
    "partition", "plan",
    "schedule", "simulate", "train",
]


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # Importing the submodule gnnpipe.api.train (or .plan, .partition, .simulate) binds it on
        # the package; gp.train must stay the function of the same name.
        if isinstance(value, types.ModuleType) and _HOMES.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # pickled by name, like any module (cloudpickle, sending a script's functions that use
        # ``gp`` to Dask workers, dispatches on the exact type ModuleType)
        return importlib.import_module, (self.__name__,)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API only (what tab completion offers), not this module's own helpers."""
    return sorted(__all__)


sys.modules[__name__].__class__ = _Package
