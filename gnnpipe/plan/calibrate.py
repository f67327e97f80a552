"""What a graph-parallel rank waits at each halo swap beyond its transfer, measured in a short
``graph`` run on the plan's own cluster.

A ``graph`` rank swaps halo rows with its peers at every aggregation, forward and backward, and
the ranks go in step: each swap waits for the slowest peer to arrive and for the rows to cross.
The profile predicts a graph rank's compute within 1-3% (``benchmarks/graph_gap.py``: its
forward, backward and step with the network taken out) and the link measures the crossing, yet a
GCNII-32 rank on 50,000 nodes waited 7.7-9.0 ms per swap where the bytes at the link's speed
take 3.9 ms: the ranks' skew, and the transfer sharing the cores with the other rank's work.
Neither shows outside a run. So when a ``graph`` layout contends for the pick, the planner runs
it for :data:`EPOCHS` epochs on the cluster, and the time its epochs took beyond the prediction,
per swap, becomes the profile's :attr:`~gnnpipe.plan.profile.Profile.swap_wait` for every
``graph`` candidate. The difference is kept whatever its sign: a run faster than predicted (a
GAT-8 on 20,000 nodes measured 0.73 s an epoch where the profile predicted 0.98 s; its
attention ops over half the graph at once run faster on a rank than in the profile's merged
chunk) gives a negative wait, and the layout that ran is then predicted at what it measured,
not above the pipeline it beat.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from typing import Any

from torch_geometric.data import Data

from gnnpipe.checkpoint import Recovery
from gnnpipe.core.job import TrainConfig
from gnnpipe.nn import LayerStack
from gnnpipe.plan.costs import swaps_per_epoch
from gnnpipe.plan.profile import Profile
from gnnpipe.runtime.start import start_distributed

__all__ = ["CONTENDS", "EPOCHS", "measure_swap_wait"]

#: Epochs of the measuring run; the first is not timed (its ranks build their halo plans), the
#: second is (each further epoch would cost the plan about one more epoch of the pick).
EPOCHS = 2
#: A ``graph`` layout predicted within this factor of the chosen one's epoch contends for the
#: pick (the ``graph`` predictions it corrects were 3-35% off, either way).
CONTENDS = 1.35


def measure_swap_wait(cluster: Any, model: LayerStack, data: Data, job: TrainConfig,
                      profile: Profile, predicted: float) -> Profile:
    """``profile`` with its ``swap_wait``: seconds per halo swap that ``job`` (a ``graph``
    layout predicted to take ``predicted`` seconds an epoch without it) took beyond the
    prediction, over the median of its timed epochs on ``cluster`` (below 0 where it ran faster
    than predicted; 0 for a layout that swaps nothing)."""
    timed = dataclasses.replace(job, epochs=EPOCHS, eval_every=EPOCHS + 1)
    run = start_distributed(copy.deepcopy(model), data, timed, cluster, Recovery()).wait()
    measured = statistics.median(run.history["epoch_time"].iloc[1:])
    swaps = swaps_per_epoch(profile, job.parts)
    wait = (measured - predicted) / swaps if swaps else 0.0
    return dataclasses.replace(profile, swap_wait=wait)
