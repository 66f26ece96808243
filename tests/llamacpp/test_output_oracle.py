"""The output oracle (fuzz/judge/oracle_outputs.py), pure: tolerance, near-ties at
the list's edge, token differences; and absent cold runs judge nothing."""

from __future__ import annotations

from fuzz.judge.oracle_outputs import (
    LOGPROB_TOLERANCE,
    check_outputs,
    compare_tops,
    request_difference,
)
from fuzz.judge.oracle_registry import BY_NAME


def _e(i, ids, tops, cold_ids, cold_tops, hit=10):
    return {
        "request": i,
        "hit": hit,
        "output_ids": ids,
        "top_logprobs": tops,
        "cold_output_ids": cold_ids,
        "cold_top_logprobs": cold_tops,
    }


def test_within_tolerance_agrees_beyond_diverges():
    a = [[[5, -1.0], [7, -1.5]]]
    near = [[[5, -1.0 + LOGPROB_TOLERANCE / 2], [7, -1.5]]]
    far = [[[5, -1.0 + 2 * LOGPROB_TOLERANCE], [7, -1.5]]]
    assert request_difference(_e(0, [5], a, [5], near)) is None
    assert "logprob" in request_difference(_e(0, [5], a, [5], far))
    assert "generated token 0" in request_difference(_e(0, [5], a, [7], a))


def test_an_id_at_the_edge_of_one_list_only_is_a_tie_not_a_difference():
    assert compare_tops([[1, -1.0], [2, -3.0]], [[1, -1.0], [3, -3.0 - 1e-4]]) is None
    assert compare_tops([[1, -1.0], [2, -2.0]], [[1, -1.0], [3, -3.0]]) is not None


def test_check_outputs_names_requests_and_skips_observations_without_a_cold_run():
    obs = {"hits": [0, 10], "explain": [_e(0, [5], [], [5], []), _e(1, [5], [], [6], [])]}
    d = check_outputs(None, "llamacpp==x", obs)
    assert len(d) == 1 and d[0].requests == [1] and d[0].oracle == "outputs"
    assert check_outputs(None, "vllm==0.33.0", {"hits": [0], "explain": [{"request": 0, "hit": 0}]}) == []
    assert BY_NAME["outputs"].neutral and BY_NAME["outputs"].severity == "wrong output possible"
