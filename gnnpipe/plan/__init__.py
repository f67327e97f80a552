"""Planning: how to run a job on ``N`` workers (RaNNC's idea, over every mode).

``gp.plan(model, data, workers)`` profiles the model in context once (:mod:`.profile`), weighs
every layout (:mod:`.layout`: single, pipeline, graph, hybrid, with their memory options), each
at its best stage split (:mod:`.stages`, dynamic programming) and chunk count, with a predicted
epoch (:mod:`.costs`), every rank's memory and its bytes per epoch (:mod:`.search`), and returns
a :class:`Plan` (:mod:`.result`) that ``gp.train(plan=...)`` runs.
"""

from gnnpipe.core.units import DEFAULT_BANDWIDTH, format_bytes, parse_bandwidth, parse_bytes
from gnnpipe.plan.costs import DEFAULT_LATENCY
from gnnpipe.plan.layout import PLANNED_MODES, Layout
from gnnpipe.plan.planner import DEFAULT_SCHEDULES, MAX_CHUNKS, memory_costs, plan
from gnnpipe.plan.profile import BlockCost, Profile, profile_model
from gnnpipe.plan.result import PLAN_FORMAT, Plan
from gnnpipe.plan.search import chunk_candidates
from gnnpipe.plan.stages import split_stages

__all__ = [
    "DEFAULT_BANDWIDTH", "DEFAULT_LATENCY", "DEFAULT_SCHEDULES", "MAX_CHUNKS", "PLANNED_MODES",
    "PLAN_FORMAT", "BlockCost", "Layout", "Plan", "Profile", "chunk_candidates", "format_bytes",
    "memory_costs", "parse_bandwidth", "parse_bytes", "plan", "profile_model", "split_stages",
]
