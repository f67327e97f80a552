"""PyG models in, as they are: ``gp.models.from_pyg(model)`` turns a ``torch_geometric.nn.models``
BasicGNN (``GCN``, ``GraphSAGE``, ``GIN``, ``GAT``, ...) or a ``torch_geometric.nn.Sequential`` into
a :class:`~gnnpipe.models.LayerStack` whose blocks *share* the model's parameters, so training the
stack trains the user's object.

Each message-passing layer becomes (the head of) a block and runs through
``ctx.message_passing`` (:mod:`gnnpipe.engine.message_passing`); pointwise parts (activations,
row-wise norms, linear heads, residual sums in a Sequential) run as they are, and ``nn.Dropout``
becomes ``ctx.dropout`` with the same ``p`` so its masks are keyed by (seed, epoch, chunk, layer);
a layer's own dropout (GAT's attention dropout) draws from a generator seeded by the same key.
Parts whose output depends on other rows than their own (batch statistics, jumping knowledge over
every layer) cannot be chunked and are refused, naming the part.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from gnnpipe.core.kinds import BlockKind, StrEnum
from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.message_passing import check_exact_in_graph_mode, check_module
from gnnpipe.nn import Block, LayerStack

__all__ = ["Part", "PartKind", "PyGBlock", "Step", "as_stack", "check_mode", "default_techniques",
           "for_training", "from_pyg"]



class PartKind(StrEnum):
    """What a part of a PyG model is: a message-passing ``conv``, any other ``module``, a
    ``dropout``, or (stored in a block) a plain function ``fn``."""

    CONV = "conv"
    MODULE = "module"
    DROPOUT = "dropout"
    FN = "fn"


#: A model part, (kind, op, reads, writes): kind ``conv`` (op: a MessagePassing), ``module``
#: (op: any callable) or ``dropout`` (op: p), reading and writing named values.
Part = tuple[PartKind, Any, list[str], list[str]]
#: How a block stores a part: op becomes an index into its ``mods`` or ``fns`` (kind ``fn``).
Step = tuple[PartKind, Any, list[str], list[str]]
_KEY_STRIDE = 1 << 20  # keys of a block's second, third... conv or dropout: key + j * stride


class PyGBlock(Block):
    """A run of a PyG model's parts: message-passing layers via ``ctx.message_passing``, dropout
    via ``ctx.dropout``, anything else called as is, on named values (a Sequential's dataflow).
    """

    def __init__(self, parts: list[Part], source: str,
                 result: str, kind: str) -> None:
        super().__init__()
        self.kind, self.source, self.result = BlockKind(kind), source, result
        self.mods = nn.ModuleList()
        self.fns: list[Callable[..., Any]] = []
        self.steps: list[Step] = []
        for kind_of_part, op, reads, writes in parts:
            what = PartKind(kind_of_part)  # a plain string names its kind too
            if what is PartKind.DROPOUT:
                self.steps.append((PartKind.DROPOUT, float(op), reads, writes))
            elif isinstance(op, nn.Module):
                self.steps.append((what, len(self.mods), reads, writes))
                self.mods.append(op)
            else:
                self.steps.append((PartKind.FN, len(self.fns), reads, writes))
                self.fns.append(op)
        self.aggregates = any(s[0] is PartKind.CONV for s in self.steps)

    def forward(self, h: Tensor, h0: Tensor | None, ctx: Any) -> tuple[Tensor, Tensor | None]:
        values, convs, drops = {self.source: h}, 0, 0
        for what, ref, reads, writes in self.steps:
            args = [values[name] for name in reads]
            if what is PartKind.CONV:
                out = ctx.message_passing(self.mods[ref], args[0], self.key + convs * _KEY_STRIDE)
                convs += 1
            elif what is PartKind.DROPOUT:
                out = ctx.dropout(args[0], ref, self.key + drops * _KEY_STRIDE)
                drops += 1
            else:
                out = (self.mods[ref] if what is PartKind.MODULE else self.fns[ref])(*args)
            values.update(zip(writes, out) if len(writes) > 1 else [(writes[0], out)])
        return values[self.result], h0


# --------------------------------------------------------------------------- checks
def _batch_statistics() -> tuple[type, ...]:
    from torch_geometric.nn import aggr, norm
    from torch_geometric.nn.models import JumpingKnowledge

    return (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
            norm.BatchNorm, norm.InstanceNorm, norm.GraphNorm, norm.PairNorm,
            norm.MeanSubtractionNorm, norm.DiffGroupNorm, norm.GraphSizeNorm,
            JumpingKnowledge, aggr.Aggregation)


def _check_rowwise(module: Any, where: str, in_layer: bool = False) -> None:
    """Every part of ``module`` computes each row from that row alone, and draws no random
    numbers unless it runs ``in_layer`` (inside a message-passing call, whose generator gnnpipe
    seeds per chunk)."""
    if not isinstance(module, nn.Module):
        return
    from torch_geometric.nn import MessagePassing
    from torch_geometric.nn.norm import LayerNorm

    refused = _batch_statistics()
    for path, sub in module.named_modules():
        part = f"{where}.{path}" if path else where
        if isinstance(sub, MessagePassing) and sub is not module:
            raise ValueError(f"{part}: a message-passing layer nested in another part; put it "
                             f"in the model as its own layer (Sequential: 'x, edge_index -> x')")
        if isinstance(sub, refused) or (isinstance(sub, LayerNorm) and sub.mode == "graph"):
            raise ValueError(f"{part}: {type(sub).__name__} mixes rows (batch statistics over all "
                             f"nodes, or every layer's output), which differ per chunk and "
                             f"partition; use a row-wise norm (torch.nn.LayerNorm, or "
                             f"norm='layer_norm' with norm_kwargs={{'mode': 'node'}}) or none")
        if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0.0 and not in_layer:
            raise ValueError(f"{part}: {type(sub).__name__}(p={sub.p}) inside a part draws masks "
                             f"from torch's global generator, which chunked and distributed modes "
                             f"cannot reproduce; make it a torch.nn.Dropout step of its own")


def _check_conv(conv: Any, where: str) -> None:
    """A one-hop conv whose inner parts (an MLP, norms) are row-wise; its aggregation may mix."""
    from torch_geometric.nn.aggr import Aggregation

    check_module(conv, where)
    for path, sub in conv.named_children():
        if not isinstance(sub, Aggregation):
            _check_rowwise(sub, f"{where}.{path}", in_layer=True)


# --------------------------------------------------------------------------- BasicGNN
def _basic_gnn_blocks(model: Any) -> list[PyGBlock]:
    if model.jk_mode not in (None, "last"):
        raise ValueError(f"model.jk: jumping knowledge {model.jk_mode!r} combines the outputs of "
                         f"every layer at the end, which no chunk or stage split can run layer by "
                         f"layer; use jk=None or jk='last'")
    blocks = []
    for i, (conv, norm) in enumerate(zip(model.convs, model.norms)):
        _check_conv(conv, f"model.convs.{i}")
        parts: list[Part] = [(PartKind.CONV, conv, ["x"], ["x"])]
        if i < model.num_layers - 1 or model.jk_mode is not None:
            acts = [(PartKind.MODULE, model.act, ["x"], ["x"])] if model.act is not None else []
            _check_rowwise(norm, f"model.norms.{i}")
            parts += acts if model.act_first else []
            parts += [] if isinstance(norm, nn.Identity) else [(PartKind.MODULE, norm, ["x"], ["x"])]
            parts += [] if model.act_first else acts
            parts.append((PartKind.DROPOUT, model.dropout.p, ["x"], ["x"]))
        blocks.append(PyGBlock(parts, "x", "x", "gnn"))
    if hasattr(model, "lin"):
        blocks.append(PyGBlock([(PartKind.MODULE, model.lin, ["x"], ["x"])], "x", "x", "output"))
    return blocks


# --------------------------------------------------------------------------- Sequential
def _sequential_parts(model: Any) -> tuple[list[Part], str]:
    from torch_geometric.nn import MessagePassing

    names = list(model.signature.param_dict)
    if len(names) != 2:
        raise ValueError(f"model: a Sequential for gnnpipe takes (x, edge_index), got inputs "
                         f"{', '.join(names)}")
    edges = names[1]
    parts = []
    for i, child in enumerate(model._children):
        module, where = getattr(model, child.name), f"model[{i}] ({child.name})"
        reads, writes = list(child.param_names), list(child.return_names)
        if edges in reads:
            if not isinstance(module, MessagePassing) or len(reads) != 2 or reads[1] != edges \
                    or len(writes) != 1:
                raise ValueError(f"{where}: only message-passing layers may read {edges!r}, "
                                 f"called as 'h, {edges} -> out'; got "
                                 f"'{', '.join(reads)} -> {', '.join(writes)}'")
            _check_conv(module, where)
            parts.append((PartKind.CONV, module, reads[:1], writes))
        elif type(module) is nn.Dropout:
            parts.append((PartKind.DROPOUT, module.p, reads, writes))
        else:
            _check_rowwise(module, where)
            parts.append((PartKind.MODULE, module, reads, writes))
    if len(parts[-1][3]) != 1:
        raise ValueError(f"model[{len(parts) - 1}]: the last part must return one tensor")
    return parts, edges


def _segments(parts: list[Part], edges: str) -> list[tuple[int, int, str]]:
    """Split ``parts`` where exactly one value is live (a stage boundary carries one tensor):
    ``(start, stop, input value)`` per segment."""
    live: list[set[str]] = [set()] * (len(parts) + 1)
    live[-1] = set(parts[-1][3])
    for k in range(len(parts) - 1, -1, -1):
        _, _, reads, writes = parts[k]
        live[k] = (live[k + 1] - set(writes)) | (set(reads) - {edges})
    cuts = [0] + [k for k in range(1, len(parts)) if len(live[k]) == 1] + [len(parts)]
    return [(a, b, next(iter(live[a]))) for a, b in itertools.pairwise(cuts)]


def _sequential_blocks(model: Any) -> list[PyGBlock]:
    parts, edges = _sequential_parts(model)
    if not any(p[0] is PartKind.CONV for p in parts):
        raise ValueError("model: the Sequential has no message-passing layer")
    segs = _segments(parts, edges)

    def has_conv(seg: tuple[int, int, str]) -> bool:
        return any(p[0] is PartKind.CONV for p in parts[seg[0]:seg[1]])

    def has_params(seg: tuple[int, int, str]) -> bool:
        return any(isinstance(p[1], nn.Module) and any(True for _ in p[1].parameters())
                   for p in parts[seg[0]:seg[1]])

    last_conv = max(i for i, seg in enumerate(segs) if has_conv(seg))
    groups: list[tuple[str, list[tuple[int, int, str]]]] = []
    for i, seg in enumerate(segs):  # a block per conv, leading parts an input block, a head
        if has_conv(seg):
            groups.append(("gnn", [seg]))
        elif not groups:
            groups.append(("input", [seg]))
        elif i > last_conv and has_params(seg) and groups[-1][0] != "output":
            groups.append(("output", [seg]))
        else:
            groups[-1][1].append(seg)
    if groups[0][0] == "input" and not any(has_params(seg) for seg in groups[0][1]):
        groups[:2] = [("gnn", groups[0][1] + groups[1][1])]  # leading dropout: no block of its own
    result = parts[-1][3][0]
    blocks = []
    for g, (kind, group) in enumerate(groups):
        stop = groups[g + 1][1][0][2] if g + 1 < len(groups) else result
        blocks.append(PyGBlock([parts[k] for a, b, _ in group for k in range(a, b)],
                               group[0][2], stop, kind))
    return blocks


# --------------------------------------------------------------------------- entry points
def _declared_in_dim(model: Any) -> Any:
    """The input width the model states: a BasicGNN's ``in_channels``, else the ``in_channels`` /
    ``in_features`` of a Sequential's first part with weights (dropout and activations before it
    keep the width)."""
    if hasattr(model, "convs"):
        return model.in_channels
    for part in (model[i] for i in range(len(model))):
        width = getattr(part, "in_channels", getattr(part, "in_features", None))
        if width is not None or (isinstance(part, nn.Module) and any(True for _ in part.parameters())):
            return width  # the first part with weights sets the width, stated or not
    return None


def _in_dim(model: Any, in_dim: int | None) -> int:
    in_dim = _declared_in_dim(model) if in_dim is None else in_dim
    if isinstance(in_dim, bool) or not isinstance(in_dim, int) or in_dim < 1:
        raise ValueError(f"in_dim: the model's first part does not say its input width; pass "
                         f"gp.models.from_pyg(model, in_dim=<feature width>), got {in_dim!r}")
    return in_dim


def _set_widths(blocks: list[PyGBlock], in_dim: int) -> None:
    """Learn the blocks' widths from one run on a 4-node ring."""
    from gnnpipe.engine.probe import probe_calls

    probe_calls(blocks, in_dim, set_dims=True)


def from_pyg(model: nn.Module, in_dim: int | None = None) -> LayerStack:
    """A :class:`~gnnpipe.models.LayerStack` over ``model``'s own parameters.

    Args:
        model: a ``torch_geometric.nn.models`` BasicGNN (``GCN``, ``GraphSAGE``, ``GIN``, ``GAT``,
            ...; ``jk`` ``None`` or ``"last"``) or a ``torch_geometric.nn.Sequential`` over
            ``(x, edge_index)`` whose message-passing layers are called as ``h, edge_index -> out``.
        in_dim: the feature width, where the model does not say it (lazy ``-1`` channels).

    Raises:
        TypeError: ``model`` is neither.
        ValueError: naming a part that cannot be chunked, and what to use instead.
    """
    from torch_geometric.nn import Sequential
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    if isinstance(model, BasicGNN):
        blocks = _basic_gnn_blocks(model)
    elif isinstance(model, Sequential):
        blocks = _sequential_blocks(model)
    else:
        raise TypeError(f"model: expected a torch_geometric BasicGNN (GCN, GraphSAGE, GIN, GAT, "
                        f"...) or torch_geometric.nn.Sequential, got {type(model).__name__}")
    _set_widths(blocks, _in_dim(model, in_dim))
    return LayerStack(blocks, norm="mean", name=type(model).__name__.lower())


def as_stack(model: Any, data: Any = None) -> Any:
    """``model`` itself unless it is a PyG BasicGNN or Sequential, which :func:`from_pyg`
    converts (``data``'s feature width where the model does not say its own)."""
    from torch_geometric.nn import Sequential
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    if not isinstance(model, (BasicGNN, Sequential)):
        return model
    declared = _declared_in_dim(model)
    fits = isinstance(declared, int) and declared > 0
    return from_pyg(model, None if fits else getattr(data, "num_features", None))


def _ship_generated_code(model: nn.Module) -> None:
    """Let workers rebuild message-passing classes that travel by value (defined in ``__main__``,
    a notebook or a test): PyG replaces such a class's ``propagate`` with code it generated into a
    module workers cannot import, so that module travels by value too."""
    import sys

    import cloudpickle
    from torch_geometric.nn import MessagePassing

    for module in model.modules():
        if not isinstance(module, MessagePassing):
            continue
        cls = type(module)
        prefix = f"{cls.__module__}_{cls.__name__}_"
        for attr in ("propagate", "collect", "edge_updater", "edge_collect"):
            name = getattr(cls.__dict__.get(attr), "__module__", None) or ""
            if name.startswith(prefix) and name in sys.modules:
                cloudpickle.register_pickle_by_value(sys.modules[name])


def for_training(model: Any, mode: str, data: Any = None) -> Any:
    """:func:`as_stack`, refusing message-passing layers a mode cannot run (before any worker
    starts), named as in the model the user passed."""
    stack = as_stack(model, data)
    if not isinstance(stack, LayerStack):
        return stack
    _ship_generated_code(stack)
    check_mode(model if isinstance(model, nn.Module) else stack, mode)
    return stack


def check_mode(model: nn.Module, mode: str) -> None:
    """Refuse the message-passing layers of ``model`` (the user's, for their names) that
    ``mode`` cannot run: ``graph`` a layer's own dropout, ``hybrid`` a flow other than
    source-to-target."""
    if mode not in ("graph", "hybrid"):
        return
    from torch_geometric.nn import MessagePassing

    for name, module in model.named_modules():
        if not isinstance(module, MessagePassing):
            continue
        where = f"model.{name}" if name else "model"
        if mode == "graph":
            check_exact_in_graph_mode(module, where)
        elif module.flow != "source_to_target":
            raise ValueError(f"{where}: mode 'hybrid' shares the rows messages flow from; "
                             f"{type(module).__name__} has flow={module.flow!r}, expected "
                             f"'source_to_target' (or use 'pipeline')")


def default_techniques(stack: LayerStack) -> Techniques:
    """GNNPipe's techniques when ``train`` is given none: :class:`Techniques`' defaults (random
    order and snapshot on, unbiased gradients off: issue #28, ``benchmarks/squirrel.py``) for
    stacks that aggregate with ``Â @ h``; for a stack holding PyG message-passing layers, the
    snapshot off too ("fresh" historical rows and each chunk's latest pushed gradient). Measured on Cora
    (``benchmarks/pyg_accuracy.py``, seeds 0-2): a GAT with dropout 0.6 trained 2 x 8 chunks
    came 1.5 points below single this way, 3.0 below with every technique on (seeds 0-7: 0.8
    and 2.5); a 100-epoch GAT reached 0.75 against 0.44."""
    from torch_geometric.nn import MessagePassing

    if any(isinstance(m, MessagePassing) for m in stack.modules()):
        return Techniques(snapshot=False, unbiased_grad=False)
    return Techniques()
