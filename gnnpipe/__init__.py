"""gnnpipe: deep GNN training on whole graphs with GNNPipe's layer pipeline, graph parallelism
and their hybrid, on Dask workers."""

from __future__ import annotations

from gnnpipe import datasets, models, schedule
from gnnpipe.engine.chunked import Techniques
from gnnpipe.events import Timeline
from gnnpipe.partition import Partitioning, chunk, partition
from gnnpipe.plan import Plan, plan
from gnnpipe.run import Run
from gnnpipe.runtime.cluster import Cluster
from gnnpipe.simulate import simulate
from gnnpipe.train import train
from gnnpipe.volume import comm_volume

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "Partitioning",
    "Plan",
    "Run",
    "Techniques",
    "Timeline",
    "__version__",
    "chunk",
    "comm_volume",
    "datasets",
    "models",
    "partition",
    "plan",
    "schedule",
    "simulate",
    "train",
]
