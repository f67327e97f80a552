"""The model zoo, as users reach it (``gp.models``): the built-in deep GNNs
(:mod:`gnnpipe.nn`) and :func:`from_pyg` for PyG models (:mod:`gnnpipe.pyg`).

A facade at the top layer: it adds no code, so :mod:`gnnpipe.nn` stays below the engines and the
PyG adapter that build on it.
"""

from __future__ import annotations

from gnnpipe.nn import (
    MODELS,
    NORMS,
    Block,
    Context,
    Dense,
    GCNIILayer,
    GCNLayer,
    LayerStack,
    ResGCNPlusLayer,
    SAGELayer,
    build,
    gcn,
    gcnii,
    resgcn_plus,
    sage,
)
from gnnpipe.pyg import PyGBlock, from_pyg

__all__ = ["MODELS", "NORMS", "Block", "Context", "Dense", "GCNIILayer", "GCNLayer", "LayerStack",
           "PyGBlock", "ResGCNPlusLayer", "SAGELayer", "build", "from_pyg", "gcn", "gcnii",
           "resgcn_plus", "sage"]
