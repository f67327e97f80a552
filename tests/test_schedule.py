"""Tests for gnnpipe.schedule: op order, dependencies, validation and the step grid."""

from __future__ import annotations

import textwrap

import pytest

from gnnpipe import schedule
from gnnpipe.schedule import Op, Schedule


def grid(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def test_gnnpipe_grid_2x3() -> None:
    assert str(schedule.gnnpipe(2, 3)) == grid("""
        gnnpipe: 2 stages, 3 chunks, 2 ranks
        step  r0  r1
        0     F0  .
        1     F1  F0
        2     F2  F1
        3     .   F2
        4     .   B2
        5     B2  B1
        6     B1  B0
        7     B0  .
    """)


def test_gpipe_grid_2x2_backward_in_reverse() -> None:
    assert str(schedule.gpipe(2, 2)) == grid("""
        gpipe: 2 stages, 2 chunks, 2 ranks
        step  r0  r1
        0     F0  .
        1     F1  F0
        2     .   F1
        3     .   B1
        4     B1  B0
        5     B0  .
    """)


def test_one_f_one_b_grid_2x4() -> None:
    assert str(schedule.one_f_one_b(2, 4)) == grid("""
        1f1b: 2 stages, 4 chunks, 2 ranks
        step  r0  r1
        0     F0  .
        1     F1  F0
        2     .   B0
        3     B0  F1
        4     F2  B1
        5     B1  F2
        6     F3  B2
        7     B2  F3
        8     .   B3
        9     B3  .
    """)


def test_single_stage_with_step_grid() -> None:
    assert str(schedule.gnnpipe(1, 3, step=True)) == grid("""
        gnnpipe: 1 stages, 3 chunks, 1 ranks
        step  r0
        0     F0
        1     F1
        2     F2
        3     B2
        4     B1
        5     B0
        6     S
    """)


def test_grid_wide_labels_align() -> None:
    rows = str(schedule.gnnpipe(2, 11)).splitlines()
    assert rows[1] == "step  r0   r1"
    assert rows[2] == "0     F0   ."
    assert rows[12] == "10    F10  F9"
    assert len(rows) == 2 + 2 * (11 + 2 - 1)


def test_gnnpipe_order_and_deps() -> None:
    s = schedule.gnnpipe(3, 4)
    assert (s.num_ranks, s.num_stages, s.num_chunks, len(s)) == (3, 3, 4, 24)
    r1 = s.ranks[1]
    assert [(op.kind, op.chunk) for op in r1] == (
        [("forward", c) for c in range(4)] + [("backward", c) for c in (3, 2, 1, 0)])
    assert all(op.stage == 1 for op in r1)
    assert r1[0].deps == (("forward", 0, 0, 0),)
    assert r1[4].deps == (("backward", 2, 3, 0),)
    last = s.ranks[2]
    assert last[4].deps == (("forward", 2, 3, 0),)
    assert s.ranks[0][0].deps == ()


def test_one_f_one_b_warmup_counts() -> None:
    s = schedule.one_f_one_b(4, 8)
    for rank, ops in enumerate(s.ranks):
        kinds = [op.kind for op in ops]
        assert kinds.index("backward") == min(4 - rank, 8)
        assert [op.chunk for op in ops if op.kind == "backward"] == list(range(8))
        assert [op.chunk for op in ops if op.kind == "forward"] == list(range(8))
    # Fewer micro-batches than stages: warm-up is capped at M.
    assert [op.kind for op in schedule.one_f_one_b(4, 2).ranks[0]] == [
        "forward", "forward", "backward", "backward"]


def test_step_appended_per_rank() -> None:
    s = schedule.one_f_one_b(3, 2, step=True)
    assert all(ops[-1].kind == "step" and ops[-1].chunk == -1 for ops in s.ranks)
    assert s.ranks[2][-1].key == ("step", 2, -1, 0)


def test_to_frame() -> None:
    df = schedule.gnnpipe(2, 3).to_frame()
    assert list(df.columns) == ["rank", "order", "kind", "stage", "way", "chunk", "deps"]
    assert len(df) == 12
    assert df.groupby("rank")["order"].max().tolist() == [5, 5]
    assert df.loc[df["kind"] == "forward", "chunk"].tolist() == [0, 1, 2, 0, 1, 2]
    assert df.loc[3, "deps"] == (("backward", 1, 2, 0),)


def test_op_label_and_key() -> None:
    op = Op("backward", 2, 7)
    assert op.key == ("backward", 2, 7, 0)
    assert op.label == "B7"
    assert Op("step", 0, -1).label == "S"
    with pytest.raises(AttributeError):
        op.chunk = 3  # type: ignore[misc]


@pytest.mark.parametrize("ctor, arg", [
    (schedule.gnnpipe, "stages"), (schedule.gnnpipe, "chunks"),
    (schedule.gpipe, "stages"), (schedule.gpipe, "microbatches"),
    (schedule.one_f_one_b, "stages"), (schedule.one_f_one_b, "microbatches"),
])
@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4", None])
def test_bad_arguments_name_the_argument(ctor, arg, bad) -> None:
    names = list(ctor.__code__.co_varnames[:2])
    kwargs = {names[0]: 2, names[1]: 2, arg: bad}
    with pytest.raises(ValueError, match=rf"^{arg} must be a positive int"):
        ctor(**kwargs)


def test_numpy_ints_accepted() -> None:
    np = pytest.importorskip("numpy")
    assert len(schedule.gnnpipe(np.int64(2), np.int32(3))) == 12


def test_schedule_rejects_unknown_dep() -> None:
    with pytest.raises(ValueError, match="unknown ops"):
        Schedule("x", 1, 1, ((Op("forward", 0, 0, deps=(("forward", 0, 5, 0),)),),))


def test_schedule_rejects_duplicate_and_out_of_range_ops() -> None:
    with pytest.raises(ValueError, match="more than once"):
        Schedule("x", 1, 1, ((Op("forward", 0, 0), Op("forward", 0, 0)),))
    with pytest.raises(ValueError, match="stage outside"):
        Schedule("x", 1, 1, ((Op("forward", 1, 0),),))
    with pytest.raises(ValueError, match="chunk outside"):
        Schedule("x", 1, 2, ((Op("forward", 0, 2),),))
    with pytest.raises(ValueError, match="kind 'idle'"):
        Schedule("x", 1, 1, ((Op("idle", 0, 0),),))
    with pytest.raises(ValueError, match="num_chunks must be a positive int"):
        Schedule("x", 1, 0, ())


def test_repr() -> None:
    assert repr(schedule.one_f_one_b(3, 5)) == (
        "Schedule('1f1b', ranks=3, stages=3, chunks=5, ops=30)")
