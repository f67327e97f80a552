"""Bad input to the public API (gp.train, gp.datasets, gp.plan, gp.simulate, gp.schedule) is
refused with an error naming the argument, before any Dask cluster or client is contacted;
good input still trains."""

from __future__ import annotations

import copy
import logging
import math
import socket

import distributed
import pytest
import torch
from torch_geometric.data import Data

import gnnpipe as gp
from gnnpipe.runtime.cluster import Cluster

INF, NAN = math.inf, math.nan


def _graph(n: int = 60) -> Data:
    return gp.datasets.synthetic(num_nodes=n, avg_degree=4, num_classes=3, num_features=8, seed=0)


def _three_nodes() -> Data:
    """The smallest graph with a node in each split."""
    return Data(x=torch.randn(3, 8), y=torch.tensor([0, 1, 2]),
                edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]),
                train_mask=torch.tensor([True, False, False]),
                val_mask=torch.tensor([False, True, False]),
                test_mask=torch.tensor([False, False, True]), num_nodes=3)


def _model(hidden: int = 8, layers: int = 2, family=gp.models.gcn) -> gp.models.LayerStack:
    return family(8, hidden=hidden, out_dim=3, layers=layers)


def _free_address() -> str:
    """A loopback address where nothing listens (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class Env:
    """What the cases build their bad input from; plans and closed clusters only when asked."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request, self.data, self.model = request, _graph(), _model()

    def train(self, model=None, data=None, **kwargs):
        model, data = model or self.model, self.data if data is None else data
        args = {"epochs": 1, "progress": False, **kwargs}
        return lambda: gp.train(model, data, **args)

    def broken(self, **fields) -> Data:
        data = self.data.clone()
        for key, value in fields.items():
            setattr(data, key, value(data) if callable(value) else value)
        return data

    def plan_for(self, model) -> gp.Plan:
        return gp.plan(model, self.data, 2, chunks=4, repeats=1, modes=["pipeline"])

    def closed(self, kind: str):
        """A closed gp.Cluster or distributed.Client on the shared cluster's scheduler."""
        address = self.request.getfixturevalue("cluster").client.scheduler.address
        client = distributed.Client(address, set_as_default=False)
        handle = Cluster(client=client)
        handle.close()
        return handle if kind == "Cluster" else client


def _x(value):
    def change(d: Data) -> torch.Tensor:
        x = d.x.clone()
        x[0, 0] = value
        return x
    return change


def _mask(name: str, make):
    return {name: lambda d: make(d)}


CASES = [
    # type, range and finiteness of gp.train's scalars
    (lambda e: e.train(epochs=2.5), ValueError, "epochs: expected a positive integer"),
    (lambda e: e.train(epochs=0), ValueError, "epochs: expected a positive integer"),
    (lambda e: e.train(epochs="10"), TypeError, "epochs"),
    (lambda e: e.train(lr=INF), ValueError, "lr: expected a positive number"),
    (lambda e: e.train(lr=NAN), ValueError, "lr: expected a positive number"),
    (lambda e: e.train(lr=-0.1), ValueError, "lr"),
    (lambda e: e.train(lr="fast"), TypeError, "lr"),
    (lambda e: e.train(weight_decay=NAN), ValueError, "weight_decay: expected a number >= 0"),
    (lambda e: e.train(weight_decay=-1), ValueError, "weight_decay"),
    (lambda e: e.train(gnn_weight_decay=-1), ValueError, "gnn_weight_decay"),
    (lambda e: e.train(gnn_weight_decay=INF), ValueError, "gnn_weight_decay"),
    (lambda e: e.train(seed="x"), TypeError, "seed"),
    (lambda e: e.train(seed=-1), ValueError, "seed"),
    (lambda e: e.train(seed=1.5), ValueError, "seed"),
    (lambda e: e.train(eval_every=0), ValueError, "eval_every"),
    (lambda e: e.train(timeout=-5), ValueError, "timeout"),
    (lambda e: e.train(timeout=NAN), ValueError, "timeout"),
    (lambda e: e.train(device="gpu"), ValueError, "device: expected one of"),
    (lambda e: e.train(mode="turbo"), ValueError, "mode: unknown mode 'turbo'"),
    (lambda e: e.train(mode=3), ValueError, "mode: unknown mode 3"),
    (lambda e: e.train(background="yes"), TypeError, "background: expected True or False"),
    (lambda e: e.train(progress="no"), TypeError, "progress"),
    (lambda e: e.train(recompute="no"), TypeError, "recompute"),
    (lambda e: e.train(mode="pipeline", stages=2, workers=0), ValueError, "workers"),
    (lambda e: e.train(mode="pipeline", stages=2, workers=3), ValueError, "workers: ways x stages"),
    # technique switches
    (lambda e: e.train(mode="local", techniques={"random_order": "no"}), TypeError,
     "techniques.random_order: expected True or False"),
    (lambda e: e.train(mode="local", techniques={"snapshot": 1}), TypeError, "techniques.snapshot"),
    (lambda e: e.train(mode="local", techniques="all"), TypeError, "techniques: expected"),
    (lambda e: e.train(mode="local", techniques={"nope": True}), ValueError, "techniques: unknown"),
    # stages, chunks, ways, parts against the model and the graph
    (lambda e: e.train(mode="local", stages=0), ValueError, "stages: expected a positive integer"),
    (lambda e: e.train(mode="local", stages=3), ValueError, "stages: 3 stages need"),
    (lambda e: e.train(mode="local", chunks=0), ValueError, "chunks: expected a positive integer"),
    (lambda e: e.train(mode="local", chunks=61), ValueError, "chunks: 61 chunks exceed"),
    (lambda e: e.train(mode="local", data=_three_nodes()), ValueError,
     r"chunks: the default 4 x stages = 4 chunks exceed the graph's 3 nodes"),
    (lambda e: e.train(mode="graph", parts=4, data=_three_nodes()), ValueError,
     "parts: 4 partitions exceed the graph's 3 nodes"),
    (lambda e: e.train(mode="hybrid", ways=2, chunks=5), ValueError, "chunks: hybrid"),
    (lambda e: e.train(mode="local", ways=2), ValueError, "ways: 2 pipelines"),
    # the graph: finiteness, dtypes, ranges, masks
    (lambda e: e.train(data=e.broken(x=_x(NAN))), ValueError, "data.x: contains NaN"),
    (lambda e: e.train(data=e.broken(x=_x(INF))), ValueError, "data.x: contains NaN or inf"),
    (lambda e: e.train(data=e.broken(x=lambda d: d.x.long())), ValueError, "data.x: expected a"),
    (lambda e: e.train(data=e.broken(edge_index=lambda d: d.edge_index + 1)), ValueError,
     r"data.edge_index: node ids must lie in \[0, 60\)"),
    (lambda e: e.train(data=e.broken(edge_index=lambda d: d.edge_index.float())), ValueError,
     "data.edge_index: expected dtype"),
    (lambda e: e.train(data=e.broken(y=lambda d: d.y.clone().fill_(3))), ValueError,
     r"data.y: labels go up to 3, but the model's output width \(out_dim\) is 3"),
    (lambda e: e.train(data=e.broken(y=lambda d: -d.y - 1)), ValueError, "data.y: labels must"),
    (lambda e: e.train(data=e.broken(y=lambda d: d.y.float())), ValueError, "data.y: expected"),
    (lambda e: e.train(data=e.broken(train_mask=lambda d: d.train_mask[:-1])), ValueError,
     "data.train_mask: expected a 1-D boolean tensor of length 60"),
    (lambda e: e.train(data=e.broken(val_mask=lambda d: d.val_mask.long())), ValueError,
     "data.val_mask: expected dtype torch.bool"),
    (lambda e: e.train(data=e.broken(val_mask=lambda d: torch.zeros_like(d.val_mask))),
     ValueError, "data.val_mask: is empty"),
    (lambda e: e.train(data=e.broken(test_mask=lambda d: d.train_mask.clone())), ValueError,
     "data.test_mask: expected no training nodes"),
    (lambda e: e.train(data=e.broken(val_mask=lambda d: d.val_mask | d.train_mask)), ValueError,
     "data.val_mask: expected no training nodes"),
    (lambda e: e.train(model=gp.models.gcn(5, out_dim=3)), ValueError, "model: its input width"),
    (lambda e: e.train(model=torch.nn.Linear(8, 3)), TypeError, "model: expected a gnnpipe"),
    (lambda e: e.train(data={"x": 1}), TypeError, "data: expected a torch_geometric"),
    # plans made for another model
    (lambda e: e.train(mode="local", plan=e.plan_for(_model(family=gp.models.sage))), ValueError,
     r"plan: it was made for another model: block 0 is \('SAGELayer'"),
    (lambda e: e.train(mode="local", plan=e.plan_for(_model(hidden=16))), ValueError,
     "plan: it was made for another model"),
    (lambda e: e.train(mode="local", plan=e.plan_for(_model(layers=3))), ValueError,
     "plan: its stage ranges"),
    (lambda e: e.train(mode="local", data=_graph(80), plan=e.plan_for(e.model)), ValueError,
     r"plan: it was made for a graph of 60 nodes, got one of 80; plan for this graph"),
    (lambda e: e.train(mode="local", plan={"ranges": [(0, 2)], "chunks": 4}), TypeError,
     "plan: expected a gp.Plan"),
    # cluster arguments
    (lambda e: e.train(mode="pipeline", stages=2, cluster=42), TypeError, "cluster: expected None"),
    (lambda e: e.train(mode="pipeline", stages=2, cluster=_free_address()), ValueError,
     "cluster: nothing answers at tcp://127.0.0.1:"),
    (lambda e: e.train(mode="graph", cluster="nonsense"), ValueError,
     "cluster: expected a scheduler address"),
    (lambda e: e.train(mode="pipeline", stages=2, cluster=e.closed("Cluster")), ValueError,
     "cluster: the Cluster given is closed"),
    (lambda e: e.train(mode="pipeline", stages=2, cluster=e.closed("Client")), ValueError,
     "cluster: the Client given is closed"),
    # gp.datasets.synthetic
    *[(lambda e, kw=kw: lambda: gp.datasets.synthetic(**{"num_nodes": 100, **kw}), error, match)
      for kw, error, match in [
          ({"num_nodes": 0}, ValueError, "num_nodes: expected an integer >= 3"),
          ({"num_nodes": -5}, ValueError, "num_nodes"),
          ({"num_nodes": 10.5}, ValueError, "num_nodes"),
          ({"num_nodes": 5, "avg_degree": 2}, ValueError, "num_nodes: 5 nodes leave a split empty"),
          ({"homophily": 1.5}, ValueError, "homophily: expected a share in"),
          ({"homophily": -0.1}, ValueError, "homophily"),
          ({"homophily": NAN}, ValueError, "homophily"),
          ({"homophily": "high"}, TypeError, "homophily"),
          ({"avg_degree": 0}, ValueError, "avg_degree"),
          ({"avg_degree": -1}, ValueError, "avg_degree"),
          ({"num_classes": 1}, ValueError, "num_classes"),
          ({"num_features": 0}, ValueError, "num_features"),
          ({"seed": "x"}, TypeError, "seed")]],
    # gp.schedule and gp.simulate
    (lambda e: lambda: gp.schedule.gnnpipe(0, 4), ValueError, "stages must be a positive int"),
    (lambda e: lambda: gp.schedule.gnnpipe(2, -1), ValueError, "chunks must be a positive int"),
    (lambda e: lambda: gp.schedule.gpipe(2, 2.0), ValueError, "chunks"),
    (lambda e: lambda: gp.schedule.one_f_one_b(2, 2, step="yes"), TypeError, "step"),
    (lambda e: lambda: gp.simulate(gp.schedule.gnnpipe(2, 2), -1.0), ValueError, "costs"),
    (lambda e: lambda: gp.simulate(gp.schedule.gnnpipe(2, 2), {"forward": NAN, "backward": 1}),
     ValueError, "costs"),
    (lambda e: lambda: gp.simulate(gp.schedule.gnnpipe(2, 2), {"forward": 1}), ValueError,
     "costs has no entry"),
    (lambda e: lambda: gp.simulate(gp.schedule.gnnpipe(2, 2), {"forwrd": 1, "backward": 1}),
     ValueError, "costs: key 'forwrd' names no op kind"),
    (lambda e: lambda: gp.simulate("gnnpipe", 1.0), TypeError, "schedule: expected"),
    (lambda e: lambda: gp.simulate(gp.schedule.gnnpipe(2, 2), 1.0, comm=-1), ValueError, "comm"),
    # gp.plan
    *[(lambda e, kw=kw: lambda: gp.plan(e.model, e.data, **{"workers": 2, **kw}), error, match)
      for kw, error, match in [
          ({"workers": 0}, ValueError, "workers: expected a positive integer"),
          ({"workers": "2"}, TypeError, "workers"),
          ({"memory_limit": "lots"}, ValueError, "memory_limit: expected a size"),
          ({"memory_limit": NAN}, ValueError, "memory_limit"),
          ({"bandwidth": "fast"}, ValueError, "bandwidth: expected bytes per second such as '1GB/s'"),
          ({"bandwidth": -1}, ValueError, "bandwidth"),
          ({"latency": NAN}, ValueError, "latency"),
          ({"modes": ["hybrid"]}, ValueError, "modes: hybrid has no layout on 2 worker"),
          ({"chunks": 0}, ValueError, "chunks: expected a positive integer"),
          ({"modes": ["pipe"]}, ValueError, "modes: expected some of"),
          ({"compact": "yes"}, TypeError, "compact: expected None, True or False"),
          ({"profile": "cached"}, TypeError, "profile: expected a Profile")]],
]


def _record_dask(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the Dask objects created from now on (each still created as usual)."""
    made: list[str] = []
    for cls in (Cluster, distributed.Client, distributed.LocalCluster):
        def record(self, *args, _init=cls.__init__, _name=cls.__name__, **kwargs):
            made.append(_name)
            _init(self, *args, **kwargs)
        monkeypatch.setattr(cls, "__init__", record)
    return made


@pytest.mark.parametrize("build, error, match", CASES)
def test_bad_input_is_refused_before_any_dask_contact(request, monkeypatch, build, error, match):
    call = build(Env(request))  # closed clusters and plans are made before recording starts
    made = _record_dask(monkeypatch)
    with pytest.raises(error, match=match):
        call()
    # nothing was started or connected to (an unreachable address fails at the TCP probe)
    assert made == []


def test_there_are_enough_cases():
    assert len(CASES) >= 45


def test_float64_features_are_converted_to_float32(caplog):
    data, model = _graph(), _model()
    wide = data.clone()
    wide.x = data.x.double()
    for mode in ("single", "local"):
        with caplog.at_level(logging.WARNING, logger="gnnpipe.api.door"):
            run = gp.train(copy.deepcopy(model), wide, mode, epochs=2, chunks=2, progress=False)
        assert "converting torch.float64 features to torch.float32" in caplog.text
        assert wide.x.dtype == torch.float64  # the caller's graph is left as it was
        same = gp.train(copy.deepcopy(model), data, mode, epochs=2, chunks=2, progress=False)
        assert run.history["loss"].tolist() == same.history["loss"].tolist()


def test_valid_inputs_still_train():
    data, model = _graph(), _model()
    run = gp.train(copy.deepcopy(model), _three_nodes(), epochs=2, progress=False)  # single: no chunks
    assert len(run.history) == 2 and math.isfinite(run.history["loss"].iloc[-1])
    run = gp.train(copy.deepcopy(model), data, "local", epochs=2, chunks=3, lr=0.05, seed=7,
                   gnn_weight_decay=0.0, techniques={"random_order": False}, recompute=True,
                   timeout=5, progress=False)
    assert run.history["epoch"].tolist() == [0, 1] and run.config.chunks == 3
    plan = gp.plan(model, data, 2, chunks=4, repeats=1, modes=["pipeline"])
    run = gp.train(copy.deepcopy(model), data, "local", plan=plan, epochs=1, progress=False)
    assert [tuple(r) for r in run.config.ranges] == list(plan.ranges)
