"""A chunk's rows of the adjacency, compacted to the columns they read (engine.graph.RowBlock)."""

from __future__ import annotations

import itertools

import pytest
import torch

import gnnpipe as gp
from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.chunked import StageExecutor
from gnnpipe.engine.graph import ChunkRows, GatherSpace, RowBlock, chunk_rows, normalized_adjacency


@pytest.fixture(scope="module")
def chunked_graph(small_graph):
    part = gp.chunk(small_graph, 8, seed=0)
    data = part.apply(small_graph)
    return normalized_adjacency(data.edge_index, data.num_nodes, "sym"), part.bounds.tolist()


def test_compacted_products_equal_the_plain_ones_bit_for_bit(chunked_graph):
    adj, bounds = chunked_graph
    space = GatherSpace()
    dense = torch.randn(adj.num_nodes, 16)
    for lo, hi in itertools.pairwise(bounds):
        plain = adj.rows(lo, hi)
        rows = ChunkRows.of(adj, lo, hi, space)
        for block, matrix in ((rows.A, plain.A), (rows.AT, plain.AT)):
            assert block.cols is not None and block.cols.numel() < adj.num_nodes
            assert torch.equal(block.cols, torch.unique(matrix.col_indices()).long())
            assert block.csr.size(1) == block.cols.numel()
            assert torch.equal(block @ dense, matrix @ dense)
            assert torch.equal(RowBlock.compact(matrix) @ dense, matrix @ dense)  # no space


def test_rows_reading_every_column_stay_plain(chunked_graph):
    adj, _ = chunked_graph
    block = RowBlock.compact(adj.A)  # self-loops: the whole matrix reads every column
    assert block.cols is None and block.csr is adj.A


def test_one_gather_buffer_per_width_serves_every_product(chunked_graph):
    adj, bounds = chunked_graph
    space = GatherSpace()
    blocks = [ChunkRows.of(adj, lo, hi, space).A for lo, hi in itertools.pairwise(bounds)]
    dense = torch.randn(adj.num_nodes, 8)
    for block in blocks:
        block @ dense
    tallest = max(b.cols.numel() for b in blocks)
    cpu = torch.device("cpu")
    gathered = space.take(1, 8, torch.float32, cpu)
    assert gathered.untyped_storage().nbytes() == tallest * 8 * 4
    assert space.take(tallest, 8, torch.float32, cpu).data_ptr() == gathered.data_ptr()
    wider = space.take(1, 4, torch.float32, cpu)
    assert wider.data_ptr() != gathered.data_ptr()  # a width of its own


def test_a_compact_dense_operand_is_read_back_in_the_blocks_dtype(chunked_graph):
    """A bfloat16 history: every product (gathered, plain, or whole-matrix) equals the float32
    product of the rounded operand, in float32."""
    adj, bounds = chunked_graph
    dense = torch.randn(adj.num_nodes, 8).to(torch.bfloat16)
    exact = adj.A.to_dense() @ dense.float()
    for space in (GatherSpace(), None):
        for lo, hi in itertools.pairwise(bounds):
            out = ChunkRows.of(adj, lo, hi, space).A @ dense
            assert out.dtype == torch.float32
            assert torch.allclose(out, exact[lo:hi], atol=1e-5)
    whole = RowBlock(adj.A) @ dense
    assert whole.dtype == torch.float32 and torch.allclose(whole, exact, atol=1e-5)


def test_a_cpu_stage_compacts_its_chunks_and_one_chunk_stays_plain(chunked_graph, small_graph):
    adj, bounds = chunked_graph
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    ex = StageExecutor(model, 0, 2, adj, bounds, Techniques(), seed=0)
    assert all(r.A.cols is not None and r.AT.cols is not None for r in ex.rows)
    whole = StageExecutor(model, 0, 2, adj, [0, adj.num_nodes], Techniques(), seed=0)
    assert whole.rows[0].A.cols is None


def test_a_compacted_stage_computes_bit_for_bit_what_a_plain_one_does(chunked_graph, small_graph):
    """The CUDA path keeps plain rows (no gather): both give the same epoch, to the bit."""
    adj, bounds = chunked_graph
    part = gp.chunk(small_graph, 8, seed=0)
    x = part.apply(small_graph).x
    grads = []
    for compact in (True, False):
        torch.manual_seed(0)
        model = gp.models.gcnii(small_graph.num_features, hidden=8, out_dim=4, layers=3)
        plain = [ChunkRows.of(adj, lo, hi, None) for lo, hi in itertools.pairwise(bounds)]
        ex = StageExecutor(model, 0, len(model), adj, bounds, Techniques(), seed=0,
                           input_grad=True, rows=None if compact else plain)
        assert all((r.A.cols is not None) == compact for r in ex.rows)
        ex.begin_epoch(0)
        outs = [ex.forward(c, [x[lo:hi]])[0] for c, (lo, hi) in enumerate(itertools.pairwise(bounds))]
        ins = [ex.backward(c, [torch.ones_like(o)])[0] for c, o in reversed(list(enumerate(outs)))]
        grads.append((outs, ins, [p.grad.clone() for p in model.parameters()]))
    for a, b in zip(*grads):
        assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_executors_of_one_process_can_share_their_chunks_rows(chunked_graph, small_graph):
    adj, bounds = chunked_graph
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    rows = chunk_rows(adj, bounds)
    first, second = (StageExecutor(model, b, b + 1, adj, bounds, Techniques(), seed=0, rows=rows)
                     for b in range(2))
    assert all(a is b for a, b in zip(first.rows, second.rows))
    spaces = {id(r.A.space) for r in rows} | {id(r.AT.space) for r in rows}
    assert len(spaces) == 1  # one gather buffer for every chunk, forward and backward
    with pytest.raises(ValueError, match="rows: expected 8 chunks' rows, got 7"):
        StageExecutor(model, 0, 2, adj, bounds, Techniques(), seed=0, rows=rows[:7])


def test_the_profile_times_a_slices_blocks_on_shared_rows(small_graph):
    """A stage's blocks read one copy of the chunks' rows; so do the profile's one-block stages."""
    from gnnpipe.plan.bench import SliceBench

    model = gp.models.gcnii(small_graph.num_features, hidden=8, out_dim=4, layers=3)
    bench = SliceBench(model, small_graph, 4, 0, len(model), seed=0)
    first = bench.executors[0].rows
    assert all(ex.rows[c] is first[c] for ex in bench.executors for c in range(len(first)))


def test_a_graph_wide_product_runs_in_row_blocks_bit_for_bit():
    """torch's CSR product holds a second result-sized buffer while it runs; ``csr_mm`` runs
    one block of rows at a time (no product's result above PRODUCT_BLOCK_BYTES), equal bit for
    bit, forward and backward (``SpMM``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from gnnpipe.engine.graph import PRODUCT_BLOCK_BYTES, SpMM, csr_mm

    data = gp.datasets.synthetic(num_nodes=30_000, avg_degree=10, num_features=64, seed=0)
    adj = normalized_adjacency(data.edge_index, data.num_nodes, "sym")
    h = torch.randn(data.num_nodes, 64, requires_grad=True)
    products: list[int] = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.layout == torch.strided and out.dim() == 2 and any(
                    isinstance(a, torch.Tensor) and a.layout == torch.sparse_csr for a in args):
                products.append(out.numel() * out.element_size())
            return out

    with Products():
        out = SpMM.apply(h, adj)
        out.backward(torch.ones_like(out))
    assert torch.equal(out, adj.A @ h.detach())
    assert torch.equal(h.grad, adj.AT @ torch.ones_like(out))
    assert products and max(products) <= PRODUCT_BLOCK_BYTES
    assert len(products) == 2 * -(-data.num_nodes // (PRODUCT_BLOCK_BYTES // (64 * 4)))
    narrow = torch.randn(data.num_nodes, 1)  # 8 KiB a block of rows... still 2 MiB blocks
    assert torch.equal(csr_mm(adj.A, narrow), adj.A @ narrow)
