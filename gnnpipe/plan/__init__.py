"""Automatic stage partitioning (RaNNC-style): profile blocks, split stages by DP, pick chunks.

``gp.plan(model, data, workers)`` profiles the model in context (:mod:`.profile`), splits its
blocks into contiguous stages by dynamic programming under a memory limit (:mod:`.stages`),
simulates GNNPipe's schedule for candidate chunk counts and returns a :class:`Plan`
(:mod:`.planner`).
"""

from gnnpipe.core.units import DEFAULT_BANDWIDTH, format_bytes, parse_bandwidth, parse_bytes
from gnnpipe.plan.planner import MAX_CHUNKS, Plan, chunk_candidates, memory_costs, plan, predict
from gnnpipe.plan.profile import BlockCost, Profile, profile_model
from gnnpipe.plan.stages import split_stages

__all__ = [
    "DEFAULT_BANDWIDTH", "MAX_CHUNKS", "BlockCost", "Plan", "Profile", "chunk_candidates",
    "format_bytes", "memory_costs", "parse_bandwidth", "parse_bytes", "plan", "predict",
    "profile_model",
    "split_stages",
]
