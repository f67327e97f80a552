"""Built-in blocks' math through ``ctx.message_passing`` with a PyG layer (for linear layers the
pushing backward must equal the built-in pull). Pickled by value: Dask workers cannot import
tests/."""

from __future__ import annotations

import copy
import sys

import cloudpickle
import torch.nn.functional as F
from torch_geometric.nn import LGConv, MessagePassing

import gnnpipe as gp
from gnnpipe.models import Block, LayerStack

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class PropGCN(Block):
    """GCNLayer's math with ``Â`` as PyG's parameter-free LGConv (gcn_norm) via message_passing."""

    aggregates = True

    def __init__(self, ref: Block) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.p, self.act = ref.in_dim, ref.out_dim, ref.p, ref.act
        self.lin, self.bias = copy.deepcopy(ref.lin), copy.deepcopy(ref.bias)
        self.prop = LGConv()

    def forward(self, h, h0, ctx):
        h = ctx.message_passing(self.prop, self.lin(ctx.dropout(h, self.p, self.key)), self.key)
        h = h + self.bias
        return (F.relu(h) if self.act else h), h0


class MeanProp(MessagePassing):
    def __init__(self) -> None:
        super().__init__(aggr="mean")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


class PropSAGE(Block):
    """SAGELayer's math with a user's mean-aggregating MessagePassing."""

    aggregates = True

    def __init__(self, ref: Block) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.p, self.act = ref.in_dim, ref.out_dim, ref.p, ref.act
        self.lin_self, self.lin_neigh = copy.deepcopy(ref.lin_self), copy.deepcopy(ref.lin_neigh)
        self.prop = MeanProp()

    def forward(self, h, h0, ctx):
        h = ctx.dropout(h, self.p, self.key)
        h = self.lin_self(h) + ctx.message_passing(self.prop, self.lin_neigh(h), self.key)
        return (F.relu(h) if self.act else h), h0


def mirrored(family: str, graph) -> tuple[LayerStack, LayerStack]:
    """A built-in stack and its copy whose aggregations run through PyG layers."""
    ref = gp.models.build(family, graph.num_features, 4, layers=3, hidden=16, dropout=0.3)
    cls = {"gcn": PropGCN, "sage": PropSAGE}[family]
    return ref, LayerStack([cls(b) for b in ref.blocks], norm=ref.norm, name=f"prop_{family}")
