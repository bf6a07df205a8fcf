"""comm_cost.comm_caused: the op time a rank's collectives caused on its main thread, from
op intervals alone (the DDP job's figures are checked end to end in
tests/integration/test_verdict_attribution.py against its own no_sync() truth)."""
from counterprof.analysis import intervals as iv
from counterprof.analysis.comm_cost import comm_caused

MM = '{"input_dims": [[4, 2048], [2048, 2048]]}'


def test_ops_beside_the_collective_give_their_time_beyond_their_twins_median():
    # three twins alone at 10 ns each; two beside the all-reduce at 16 and 14: 6 + 4 = 10 ns
    ops = [(0, 10, "aten::mm", MM), (20, 30, "aten::mm", MM), (40, 50, "aten::mm", MM),
           (100, 116, "aten::mm", MM), (120, 134, "aten::mm", MM)]
    got = comm_caused(ops, [(95, 140)])
    assert iv.total(got) == 10
    assert got == [(110, 116), (130, 134)]          # the tails of the slowed ops


def test_noise_around_the_median_cancels():
    # beside the collective: one 2 ns over, one 2 ns under the twins' median: no excess
    ops = [(0, 10, "aten::mm", MM), (20, 30, "aten::mm", MM), (100, 112, "aten::mm", MM),
           (120, 128, "aten::mm", MM)]
    assert comm_caused(ops, [(95, 140)]) == []


def test_other_shapes_are_not_twins_and_no_twin_is_no_claim():
    other = '{"input_dims": [[8, 2048], [2048, 2048]]}'
    ops = [(0, 10, "aten::mm", other), (20, 30, "aten::mm", other), (100, 130, "aten::mm", MM)]
    assert comm_caused(ops, [(95, 140)]) == []


def test_the_syncs_own_ops_count_whole_at_any_depth_and_nested_ops_are_not_counted_twice():
    ops = [(0, 50, "autograd::engine::evaluate_function: AccumulateGrad", None),
           (10, 30, "torch.distributed.ddp.reducer::copy_bucket_to_grad", None),
           (12, 20, "aten::copy_", None)]
    assert comm_caused(ops, [(60, 70)]) == [(10, 30)]


def test_without_collectives_nothing():
    assert comm_caused([(0, 10, "aten::mm", MM)], []) == []
