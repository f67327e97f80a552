"""A job's graph travels to Dask workers as raw tensor frames (not one pickle), intact."""

from __future__ import annotations

import pickle

import pytest
import torch
from distributed.protocol import deserialize, serialize
from torch_geometric.data import Data

from gnnpipe.nn import LayerStack
from gnnpipe.runtime.shipping import Cargo


class _MyData(Data):
    pass


def _graph() -> Data:
    x = torch.randn(50, 7)
    return Data(x=x.t()[:5],  # not contiguous
                edge_index=torch.randint(0, 5, (2, 20)), y=torch.arange(5),
                train_mask=torch.tensor([True, False, True, False, True]),
                h16=torch.randn(5, 3).to(torch.bfloat16), half=torch.randn(5, 2).half(),
                empty=torch.zeros(0, 4), scalar=torch.tensor(3.5), name="toy")


def _stack() -> LayerStack:
    from gnnpipe.models import gcn

    return gcn(7, 8, 3, layers=2)


def test_a_graph_arrives_whole_as_frames() -> None:
    data = _graph()
    header, frames = serialize(Cargo(_stack(), data), serializers=["dask"])
    assert header["serializer"] == "dask"
    assert len(frames) == 1 + 8  # the small pickle, then one frame per tensor
    assert max(len(memoryview(f).cast("B")) for f in frames[1:]) == data.x.numel() * 4
    back = deserialize(header, frames)
    assert isinstance(back, Cargo) and back.data.name == "toy"
    assert sorted(back.data.keys()) == sorted(data.keys())
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            got = back.data[key]
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert torch.equal(got, value), key
    back.data.x.add_(1)  # writable: a rank trains on what it was sent
    assert isinstance(back.model, LayerStack)


def test_a_model_written_in_main_travels_too() -> None:
    """A user's model from a notebook or script holds what only cloudpickle can send."""
    stack = _stack()
    offset = 2.0
    stack.shift = lambda t: t + offset  # a local lambda: plain pickle refuses it
    header, frames = serialize(Cargo(stack, _graph()), serializers=["dask"])
    back = deserialize(header, frames)
    assert header["serializer"] == "dask"
    assert torch.equal(back.model.shift(torch.zeros(2)), torch.full((2,), 2.0))


@pytest.mark.parametrize("data", [_MyData(x=torch.ones(3, 2))], ids=["subclass"])
def test_other_graphs_are_pickled_whole(data: Data) -> None:
    header, frames = serialize(Cargo(_stack(), data), serializers=["dask", "pickle"])
    assert header["serializer"] == "pickle"
    back = deserialize(header, frames)
    assert type(back.data) is _MyData and torch.equal(back.data.x, data.x)
    assert pickle.loads(pickle.dumps(back)).data.x.shape == (3, 2)
