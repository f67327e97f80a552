"""A model and its graph on their way to Dask workers, the graph's tensors as raw frames.

Dask pickles what it has no serializer for, and a PyG ``Data`` is such an object: its tensors
are copied into one pickle, sent, and copied out again on every worker. For Facebook Page-Page
(22,470 × 4,714 features, 424 MB) that took 4.7-9.8 s to reach two local workers, against 0.7 s
for the same tensors sent as Dask sends a tensor (its bytes as a frame of their own, no copy
into a pickle). :func:`ship_by_frames` registers a frozen dataclass holding a ``data: Data``
field with Dask so that the graph's tensors travel as frames and the rest (the model, the job)
as a small pickle (Dask's, which falls back to cloudpickle, so a model written in a notebook
or a script's ``__main__``, lambdas included, travels as it did before). The class's module
calls it, so a worker that unpickles the class's name registers it before it reads the frames.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from distributed.protocol import pickle
from distributed.protocol.serialize import dask_deserialize, dask_serialize
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe.nn import LayerStack

__all__ = ["Cargo", "ship_by_frames"]


def _frame(t: Tensor) -> memoryview:
    """The bytes of ``t`` (on the CPU), without a copy where it is contiguous."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")


def _tensor(frame: Any, dtype: str, shape: list[int]) -> Tensor:
    """The tensor a :func:`_frame` came from (sharing the frame's memory where it is writable)."""
    view = memoryview(frame)
    if not view.nbytes:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    raw = torch.frombuffer(bytearray(view) if view.readonly else view, dtype=torch.uint8)
    return raw.view(getattr(torch, dtype)).reshape(shape)


def _dumps(x: Any) -> tuple[dict[str, Any], list[Any]]:
    data = x.data
    if type(data) is not Data or any(isinstance(v, Tensor) and v.device.type != "cpu"
                                     for _, v in data.items()):
        raise NotImplementedError  # Dask pickles it whole instead
    tensors = {k: v for k, v in data.items() if isinstance(v, Tensor)}
    rest = Data(**{k: v for k, v in data.items() if k not in tensors})
    header = {"keys": list(tensors),
              "dtypes": [str(v.dtype).removeprefix("torch.") for v in tensors.values()],
              "shapes": [list(v.shape) for v in tensors.values()]}
    return header, [pickle.dumps(dataclasses.replace(x, data=rest)),
                    *(_frame(v) for v in tensors.values())]


def _loads(header: dict[str, Any], frames: list[Any]) -> Any:
    x = pickle.loads(frames[0])
    for key, dtype, shape, frame in zip(header["keys"], header["dtypes"], header["shapes"],
                                        frames[1:]):
        x.data[key] = _tensor(frame, dtype, shape)
    return x


def ship_by_frames(cls: type) -> type:
    """Register ``cls`` (a dataclass with a ``data: Data`` field) with Dask: its graph's tensors
    are sent as frames of their own. A ``Data`` subclass, or one with tensors off the CPU, is
    pickled whole as before."""
    dask_serialize.register(cls)(_dumps)
    dask_deserialize.register(cls)(_loads)
    return cls


@ship_by_frames
@dataclass(frozen=True)
class Cargo:
    """A model and a graph sent to workers together (the profile's)."""

    model: LayerStack
    data: Data
