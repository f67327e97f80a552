"""``gp.schedule.from_torch``: PyTorch's own schedules as gnnpipe schedules, checked against
gnnpipe's built-ins op for op (or the difference pinned), simulated to completion and, with
equal op costs, to their published bubbles."""

from __future__ import annotations

import itertools

import pytest

import gnnpipe as gp
from gnnpipe.schedule import TORCH_SCHEDULES, from_torch
from gnnpipe.schedule.pytorch import parse_action

GRID = [(s, c) for s in (2, 4, 8) for c in (s, 2 * s, 4 * s)]
UNIT = {"forward": 1.0, "backward": 1.0, "weight": 1.0}


def _ops(schedule) -> list[list[tuple[str, int, int]]]:
    return [[(str(op.kind), op.stage, op.chunk) for op in rank] for rank in schedule.ranks]


def _layouts():
    for name, multi in TORCH_SCHEDULES.items():
        for (s, c), v in itertools.product(GRID, (2,) if multi else (1,)):
            if name == "DualPipeV" and c < 2 * s:  # PyTorch refuses fewer chunks than stages
                continue
            yield name, s, c, v


@pytest.mark.parametrize("name, stages, chunks, virtual", list(_layouts()))
def test_every_torch_schedule_simulates_to_completion(name, stages, chunks, virtual):
    schedule = from_torch(name, stages, chunks, virtual)
    assert schedule.num_ranks == stages and schedule.num_stages == stages * virtual
    timeline = gp.simulate(schedule, UNIT)
    assert len(timeline) == len(schedule) and timeline.makespan() > 0
    done = {(str(op.kind), op.stage, op.chunk) for op in schedule.ops()}
    for stage, chunk in itertools.product(range(stages * virtual), range(chunks)):
        assert ("forward", stage, chunk) in done and ("backward", stage, chunk) in done
    split = name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
    assert any(op.kind == "weight" for op in schedule.ops()) == split


@pytest.mark.parametrize("stages, chunks", GRID)
def test_one_f_one_b_is_torchs_op_for_op(stages, chunks):
    assert _ops(gp.schedule.one_f_one_b(stages, chunks)) == _ops(from_torch("1F1B", stages, chunks))


@pytest.mark.parametrize("stages, chunks", GRID)
def test_interleaved_1f1b_is_torchs_but_with_one_chunk_per_rank(stages, chunks):
    ours = _ops(gp.schedule.interleaved_1f1b(stages, chunks, virtual=2))
    torch = _ops(from_torch("Interleaved1F1B", stages, chunks, virtual=2))
    if chunks > stages:
        assert ours == torch
        return
    # C = S: gnnpipe runs every forward first (Megatron-LM's rule when the micro-batches are no
    # more than the ranks); PyTorch keeps its warm-up count and starts backwards earlier. The
    # same ops on the same ranks, in another order.
    assert ours != torch and [sorted(r) for r in ours] == [sorted(r) for r in torch]
    assert all(kind == "forward" for kind, _, _ in ours[0][:2 * chunks])


@pytest.mark.parametrize("stages, chunks", GRID)
def test_gpipe_differs_from_torchs_only_in_the_backward_order(stages, chunks):
    ours, torch = _ops(gp.schedule.gpipe(stages, chunks)), _ops(from_torch("GPipe", stages, chunks))
    for mine, theirs in zip(ours, torch):
        assert mine[:chunks] == theirs[:chunks]  # the forwards, in chunk order
        assert mine[chunks:] == theirs[chunks:][::-1]  # ours C-1..0 (autograd's), PyTorch's 0..C-1


def test_no_torch_schedule_is_zb_h1_with_one_stage_per_rank():
    """ZB-H1 splits backwards on one stage per rank; PyTorch's zero-bubble schedules all hold
    two or more stages per rank, so gnnpipe's zb_h1 has no torch twin (the docs say so)."""
    splitting = {n for n in TORCH_SCHEDULES if n.endswith(("ZeroBubble", "DualPipeV"))}
    assert splitting and all(TORCH_SCHEDULES[n] for n in splitting)
    assert any(op.kind == "weight" for op in gp.schedule.zb_h1(4, 8).ops())


@pytest.mark.parametrize("name, virtual", [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2),
                                           ("LoopedBFS", 2)])
@pytest.mark.parametrize("stages, chunks", GRID)
def test_equal_costs_give_the_published_bubble(name, virtual, stages, chunks):
    """GPipe and 1F1B: (S-1)/(C+S-1) (Huang et al. 2019; Narayanan et al. 2019); interleaved
    and looped over v stages per rank, each op 1/v of a stage: (S-1)/(v·C+S-1) (Narayanan et al.
    2021; Lamy-Poirier 2023)."""
    per_op = 1.0 / virtual
    timeline = gp.simulate(from_torch(name, stages, chunks, virtual),
                           {"forward": per_op, "backward": per_op})
    expected = (stages - 1) / (virtual * chunks + stages - 1)
    assert timeline.bubble_fraction() == pytest.approx(expected, abs=1e-9)


def test_torchs_last_rank_forwards_are_numbered_from_zero():
    """PyTorch 2.13's Schedule1F1B lists its last rank's forwards as micro-batches 1..C; its
    runtime runs 0..C-1, and so does the converted schedule."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    listed = [str(a) for a in get_schedule_ops("1F1B", 4, 8)[3] if a is not None]
    converted = [op.chunk for op in from_torch("1F1B", 4, 8).ranks[3] if op.kind == "forward"]
    assert converted == list(range(8))
    if "3F8" in listed:  # PyTorch's numbering, while it has the defect
        assert "3F0" not in listed


def test_a_class_a_name_and_a_csv_give_the_same_schedule(tmp_path):
    from torch.distributed.pipelining import ScheduleInterleavedZeroBubble
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    by_name = from_torch("InterleavedZeroBubble", 2, 4, virtual=2)
    assert _ops(from_torch(ScheduleInterleavedZeroBubble, 2, 4, virtual=2)) == _ops(by_name)
    rows = get_schedule_ops("InterleavedZeroBubble", 2, 4, num_stages_per_rank=2)
    csv = tmp_path / "mine.csv"
    csv.write_text("\n".join(",".join(str(a) if a else "" for a in row) for row in rows) + "\n")
    from_csv = from_torch(csv, 2, 4, virtual=2)
    assert _ops(from_csv) == _ops(by_name) and from_csv.name == "torch:mine"


def test_dualpipev_pairs_run_forward_then_backward():
    assert parse_action("(0F3;3B1)OVERLAP_F_B") == [("forward", 0, 3), ("backward", 3, 1)]
    assert parse_action("0REDUCE_GRAD") == [] and parse_action(" ") == []
    schedule = from_torch("DualPipeV", 2, 4, virtual=2)
    assert gp.simulate(schedule, UNIT).makespan() > 0


@pytest.mark.parametrize("call, match", [
    (lambda: from_torch("Nope", 2, 4), "schedule: unknown PyTorch schedule 'Nope'"),
    (lambda: from_torch("1F1B", 2, 4, virtual=2), "virtual: 1F1B holds one stage per rank"),
    (lambda: from_torch("Interleaved1F1B", 2, 4), "virtual: Interleaved1F1B holds several"),
    (lambda: from_torch("DualPipeV", 2, 2, virtual=2), "chunks: PyTorch's DualPipeV refuses"),
    (lambda: from_torch("1F1B", 0, 4), "stages must be a positive int"),
    (lambda: parse_action("0SEND_F1"), "not a PyTorch compute action"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_csv_with_the_wrong_ranks_or_a_missing_file_is_named(tmp_path):
    csv = tmp_path / "two.csv"
    csv.write_text("0F0,0B0\n1F0,1B0\n")
    with pytest.raises(ValueError, match="stages: .*two.csv has 2 rows"):
        from_torch(csv, 3, 1)
    with pytest.raises(ValueError, match="schedule: no CSV file at"):
        from_torch(tmp_path / "none.csv", 2, 1)
    assert _ops(from_torch(csv, 2, 1)) == _ops(gp.schedule.gnnpipe(2, 1))
