"""The connector's GPU block <-> CPU chunk pairing the state stand-in moves
fingerprints by (``engine_adapter.vllm_engine.forward.transfer_cells``), on
transfer-job test doubles shaped as vLLM 0.33.0's ``GPULoadStoreSpec`` /
``CPULoadStoreSpec`` (``kv_offload/base.py:527-557``,
``kv_offload/cpu/common.py:20``): pure, no engine."""

from __future__ import annotations

from types import SimpleNamespace as Spec

from engine_adapter.vllm_engine.forward import transfer_cells


def _store(gpu_ids, sizes, starts, cpu_ids):
    """A store job double: GPU blocks to CPU chunks."""
    return Spec(
        src_spec=Spec(block_ids=gpu_ids, group_sizes=sizes, block_indices=starts), dst_spec=Spec(block_ids=cpu_ids)
    )


def test_one_block_per_chunk_pairs_each_group_with_its_own_chunks():
    # group 0: blocks 7, 8 (logical 0, 1) -> chunks 100, 101; group 1: block 9 (logical 1) -> chunk 102
    job = _store([7, 8, 9], [2, 1], [0, 1], [100, 101, 102])
    assert transfer_cells(job, 0, 1, gpu_to_cpu=True) == [(7, (100, 0)), (8, (101, 0))]
    assert transfer_cells(job, 1, 1, gpu_to_cpu=True) == [(9, (102, 0))]


def test_a_chunk_of_several_blocks_starts_mid_chunk_at_the_logical_index():
    # P = 2: group 0 logical 1..2 spans chunks 50 (sub 1) and 51 (sub 0); group 1 logical 2 -> chunk 60 sub 0
    job = _store([3, 4, 5], [2, 1], [1, 2], [50, 51, 60])
    assert transfer_cells(job, 0, 2, gpu_to_cpu=True) == [(3, (50, 1)), (4, (51, 0))]
    assert transfer_cells(job, 1, 2, gpu_to_cpu=True) == [(5, (60, 0))]


def test_a_load_pairs_the_same_cells_the_other_way_and_an_empty_group_moves_nothing():
    load = Spec(
        src_spec=Spec(block_ids=[50, 51]), dst_spec=Spec(block_ids=[11, 12], group_sizes=[0, 2], block_indices=[0, 1])
    )
    assert transfer_cells(load, 0, 2, gpu_to_cpu=False) == []
    assert transfer_cells(load, 1, 2, gpu_to_cpu=False) == [(11, (50, 1)), (12, (51, 0))]
