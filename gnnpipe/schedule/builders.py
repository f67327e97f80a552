"""Pipeline schedules: GNNPipe's chunked fill-drain, GPipe, 1F1B, interleaved 1F1B (virtual
stages) and the zero-bubble ZB-H1 (backward split into input and weight gradient)."""

from __future__ import annotations

from gnnpipe.core.kinds import OpKind
from gnnpipe.schedule.ops import Op, Schedule, backward_op, check_positive, forward_op, weight_op

__all__ = ["gnnpipe", "gpipe", "interleaved_1f1b", "one_f_one_b", "zb_h1"]


def _check_step(step: object) -> None:
    if not isinstance(step, bool):
        raise TypeError(f"step: expected True or False, got {step!r}")


def _fill_drain(name: str, stages: int, chunks: int, step: bool) -> Schedule:
    _check_step(step)
    ranks = []
    for s in range(stages):
        ops = [forward_op(s, c) for c in range(chunks)]
        ops += [backward_op(s, c, stages) for c in reversed(range(chunks))]
        if step:
            ops.append(Op(OpKind.STEP, s, -1))
        ranks.append(tuple(ops))
    return Schedule(name, stages, chunks, tuple(ranks))


def gnnpipe(stages: int, chunks: int, *, step: bool = False) -> Schedule:
    """GNNPipe's chunked fill-drain: one rank per stage; every rank runs the forward of
    chunks ``0..C-1`` in order, then their backward in reverse order ``C-1..0``.

    With equal op costs each rank idles ``(S-1)/(C+S-1)`` of the makespan.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        chunks: Number of graph chunks per epoch, ``C``.
        step: Append one optimizer ``step`` op to each rank (one step per epoch).

    Raises:
        ValueError: If ``stages`` or ``chunks`` is not a positive int.
    """
    stages = check_positive("stages", stages)
    chunks = check_positive("chunks", chunks)
    return _fill_drain("gnnpipe", stages, chunks, step)


def gpipe(stages: int, chunks: int, *, step: bool = False) -> Schedule:
    """GPipe: forward of all chunks in order, then backward in **reverse** order
    (``C-1..0``, as autograd unwinds them in torchgpipe).

    The op order equals :func:`gnnpipe`'s; the difference is in what flows: GPipe's
    chunks (micro-batches) are independent samples, GNNPipe's share historical embeddings.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        chunks: Number of chunks ``C`` (the micro-batches of sequence-model pipelines).
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If ``stages`` or ``chunks`` is not a positive int.
    """
    stages = check_positive("stages", stages)
    chunks = check_positive("chunks", chunks)
    return _fill_drain("gpipe", stages, chunks, step)


def one_f_one_b(stages: int, chunks: int, *, step: bool = False) -> Schedule:
    """PipeDream-flush 1F1B: rank ``s`` runs ``min(S-s, C)`` warm-up forwards, then
    alternates one backward and one forward, then drains the remaining backwards.

    Backwards run in chunk order ``0..C-1``; rank ``s`` keeps at most ``S-s`` chunks'
    activations alive, against ``C`` for GPipe.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        chunks: Number of chunks ``C`` (the micro-batches of sequence-model pipelines).
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If ``stages`` or ``chunks`` is not a positive int.
    """
    stages = check_positive("stages", stages)
    chunks = check_positive("chunks", chunks)
    _check_step(step)
    ranks = tuple(_one_f_one_b_rank(s, stages, chunks, step, split=False)
                  for s in range(stages))
    return Schedule("1f1b", stages, chunks, ranks)


def _one_f_one_b_rank(s: int, stages: int, chunks: int, step: bool,
                      split: bool) -> tuple[Op, ...]:
    """Rank ``s`` of 1F1B: ``S-s`` warm-up forwards, then one backward and one forward each.
    With ``split`` (ZB-H1) the backward is the input gradient only, and the weight gradient of
    chunk ``c`` follows the backward of chunk ``c+s``; the last ``s`` fill the drain."""
    warmup = min(stages - s, chunks)
    ops = [forward_op(s, c) for c in range(warmup)]
    for c in range(chunks):
        ops.append(backward_op(s, c, stages))
        if split and c >= s:
            ops.append(weight_op(s, c - s))
        if warmup + c < chunks:
            ops.append(forward_op(s, warmup + c))
    if split:
        ops += [weight_op(s, c) for c in range(max(chunks - s, 0), chunks)]
    if step:
        ops.append(Op(OpKind.STEP, s, -1))
    return tuple(ops)


def interleaved_1f1b(stages: int, chunks: int, virtual: int = 2, *,
                     step: bool = False) -> Schedule:
    """Megatron-LM's interleaved 1F1B: each of the ``S`` ranks holds ``v`` stages (Megatron-LM's
    "model chunks"), so the model is cut into ``S·v`` (virtual) stages and stage ``k`` sits on
    rank ``k mod S``.

    Chunks go through in groups of ``S``: a rank's ``k``-th forward is chunk
    ``(k // (S·v))·S + k mod S`` on its stage ``(k mod S·v) // S``; backwards run the same
    order with the stages reversed. Rank ``r`` warms up with ``2(S−1−r) + (v−1)·S``
    forwards (all of them when that reaches ``C·v``), then alternates one forward and one
    backward, then drains. With each virtual-stage op costing ``1/v`` of a full stage's, the
    bubble is ``(S−1)/(v·C + S−1)``: ``v`` times smaller than 1F1B's, for ``v`` times the
    point-to-point messages.

    Args:
        stages: Number of ranks ``S`` (physical pipeline stages).
        chunks: Number of chunks ``C`` (micro-batches), a multiple of ``S``.
        virtual: Stages per rank ``v``; ``1`` gives 1F1B's op order.
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If an argument is not a positive int, or ``chunks`` is not a
            multiple of ``stages``.
    """
    ranks_, micro = check_positive("stages", stages), check_positive("chunks", chunks)
    v = check_positive("virtual", virtual)
    _check_step(step)
    if micro % ranks_:
        raise ValueError(f"chunks must be a multiple of stages ({ranks_}), got {micro}")
    total, group = micro * v, ranks_ * v

    def which(k: int, forward: bool) -> tuple[int, int]:
        """(virtual stage index on the rank, chunk) of the rank's ``k``-th op."""
        j = (k % group) // ranks_
        return (j if forward else v - 1 - j), (k // group) * ranks_ + k % ranks_

    ranks = []
    for r in range(ranks_):
        warmup = total if micro == ranks_ else min(2 * (ranks_ - 1 - r) + (v - 1) * ranks_, total)
        order = [(True, k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [(True, warmup + i), (False, i)]
        order += [(False, i) for i in range(total - warmup, total)]
        ops = []
        for forward, k in order:
            j, m = which(k, forward)
            stage = j * ranks_ + r
            ops.append(forward_op(stage, m) if forward else backward_op(stage, m, group))
        if step:
            ops.append(Op(OpKind.STEP, r, -1))
        ranks.append(tuple(ops))
    return Schedule("interleaved", group, micro, tuple(ranks))


def zb_h1(stages: int, chunks: int, *, step: bool = False) -> Schedule:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split
    into ``backward`` (the input gradient, on the critical path) and ``weight`` (the weight
    gradient, which nothing downstream waits for).

    Rank ``s`` keeps 1F1B's ``min(S−s, C)`` warm-up forwards and its forward/backward order, and
    runs the weight gradient of chunk ``c`` right after the backward of chunk ``c + s``: the last
    stages put off the most ``weight`` ops, and the ``s + 1`` left after rank ``s``'s last
    backward fill the drain. Every rank keeps at most ``S`` chunks' activations (1F1B's peak,
    counted from a forward to its ``weight``). For ``C ≥ S`` and ``T_W ≤ T_B`` each rank idles
    ``(S−1)(T_F + T_B − T_W)`` (the paper's ZB-H1 bubble; with its ``T_F = T_B = T_W`` a third of
    1F1B's ``(S−1)(T_F + T_B + T_W)``), so the bubble is
    ``(S−1)(T_F+T_B−T_W) / (C(T_F+T_B+T_W) + (S−1)(T_F+T_B−T_W))``.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        chunks: Number of chunks ``C`` (the micro-batches of sequence-model pipelines).
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If ``stages`` or ``chunks`` is not a positive int.
    """
    stages = check_positive("stages", stages)
    chunks = check_positive("chunks", chunks)
    _check_step(step)
    ranks = tuple(_one_f_one_b_rank(s, stages, chunks, step, split=True)
                  for s in range(stages))
    return Schedule("zb-h1", stages, chunks, ranks)
