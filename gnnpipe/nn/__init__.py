"""Deep GNNs as `LayerStack`s: ordered blocks that pipeline stages split into contiguous ranges.

A block never touches the graph itself: it calls ``ctx.aggregate(h, key)`` for ``Â @ h`` and
``ctx.dropout(h, p, key)`` for dropout, so the same block runs exact full-graph
(:mod:`gnnpipe.engine.single`), chunked with historical embeddings (:mod:`gnnpipe.engine.chunked`)
or partitioned with halo exchange, and dropout masks are reproducible per (seed, epoch, chunk, key).
"""

from __future__ import annotations

from gnnpipe.nn.layers import (
    MODELS,
    Dense,
    GCNIILayer,
    GCNLayer,
    ResGCNPlusLayer,
    SAGELayer,
    build,
    gcn,
    gcnii,
    resgcn_plus,
    sage,
)
from gnnpipe.nn.stack import NORMS, Block, Context, LayerStack, check_stack

__all__ = ["MODELS", "NORMS", "Block", "Context", "Dense", "GCNIILayer", "GCNLayer", "LayerStack",
           "ResGCNPlusLayer", "SAGELayer", "build", "check_stack", "gcn", "gcnii", "resgcn_plus",
           "sage"]
