"""The chunked epoch against a hand-written reference of docs/design.md §5 (issue #28).

The reference is dense and plain autograd: one graph for the whole epoch in which chunk ``c``'s
aggregation reads its own rows, the rows of chunks done earlier this epoch (fresh, with their
gradient doubled when unbiased gradients are on: later chunks pull them at 2×) and the rows of
the chunks still to come from the historical buffer (the snapshot, or last epoch's rows); the
chunk losses summed, one backward. The engine's weight gradients must equal it, epoch after
epoch, with several chunks, two stages and dropout.
"""

from __future__ import annotations

import pytest
import torch

import gnnpipe as gp
from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.chunked import chunk_order
from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.local import LocalEngine, stage_ranges
from gnnpipe.engine.single import chunk_loss, keyed_dropout, mask_seed
from gnnpipe.partition import chunk


class _Double(torch.autograd.Function):
    """Identity forward, gradient times 2 (a fresh row read by a later chunk, unbiased)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 2.0 * g


class _ReferenceContext:
    training = True

    def __init__(self, A, bounds, c, hist, fresh, seed, epoch, unbiased):
        self.A, self.bounds, self.c, self.hist, self.fresh = A, bounds, c, hist, fresh
        self.seed, self.epoch, self.unbiased = seed, epoch, unbiased

    def aggregate(self, h, key):
        n, chunks = self.A.size(0), len(self.bounds) - 1
        hist = self.hist.setdefault(key, torch.zeros(n, h.size(1)))
        rows = []
        for j in range(chunks):
            if j == self.c:
                rows.append(h)
            elif (key, j) in self.fresh:
                f = self.fresh[(key, j)]
                rows.append(_Double.apply(f) if self.unbiased else f)
            else:
                rows.append(hist[self.bounds[j]:self.bounds[j + 1]])
        self.fresh[(key, self.c)] = h
        lo, hi = self.bounds[self.c], self.bounds[self.c + 1]
        return self.A[lo:hi] @ torch.cat(rows)

    def dropout(self, h, p, key):
        return keyed_dropout(h, p, mask_seed(self.seed, self.epoch, self.c, key)) if p else h


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("tech", [  # the reference doubles fresh rows' gradients: unbiased on
    Techniques(unbiased_grad=True),
    Techniques(snapshot=False, unbiased_grad=True),
    Techniques(snapshot_period=2, unbiased_grad=True),
    Techniques(random_order=False, snapshot_period=3, unbiased_grad=True),
])
def test_local_equals_a_dense_reference_of_the_papers_epoch(tech):
    data = gp.datasets.synthetic(num_nodes=200, avg_degree=10, num_classes=3, num_features=12,
                                 homophily=0.4, seed=1)
    torch.manual_seed(0)
    model = gp.models.gcnii(data.num_features, hidden=8, out_dim=3, layers=6, dropout=0.3)
    parts = chunk(data, 4, seed=0)
    d = parts.apply(data)
    adj = normalized_adjacency(d.edge_index, d.num_nodes, model.norm)
    A, bounds, seed = adj.A.to_dense(), parts.bounds.tolist(), 0
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    engine = LocalEngine(model, d, adj, bounds, stage_ranges(len(model), 2), tech, seed, False, opt)
    num_train = int(d.train_mask.sum())
    last, snap = {}, {}
    for epoch in range(5):
        model.train()
        model.zero_grad()
        hist = {k: v.clone() for k, v in (snap if tech.snapshot else last).items()}
        fresh = {}
        loss = 0.0
        for c in chunk_order(4, seed, epoch, tech.random_order):
            lo, hi = bounds[c], bounds[c + 1]
            ctx = _ReferenceContext(A, bounds, c, hist, fresh, seed, epoch, tech.unbiased_grad)
            loss = loss + chunk_loss(model(d.x[lo:hi], ctx), d.y[lo:hi], d.train_mask[lo:hi],
                                     num_train)
        loss.backward()
        expected = _grads(model)
        last = {k: torch.cat([fresh[(k, j)].detach() for j in range(4)]) for k in hist}
        if tech.snapshot and tech.snapshot_due(epoch):
            snap = {k: v.clone() for k, v in last.items()}

        engine.begin_epoch(epoch)
        engine.run_chunks(epoch)
        for got, want in zip(_grads(model), expected):
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), f"epoch {epoch}"
        engine.step(epoch)
