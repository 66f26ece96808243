"""The slow fidelity tier's shares (``pytest spec/ --shard K/N``): every
task in exactly one share, and a bad value refused in one line."""

from __future__ import annotations

import pytest

from spec import parallel
from spec.conftest import parse_shard


def test_the_shares_of_a_task_list_cover_it_once(monkeypatch):
    tasks = list(range(23))
    shares = []
    for k in range(4):
        monkeypatch.setattr(parallel, "SHARD", (k, 4))
        shares.append(parallel.sharded(tasks))
    assert sorted(x for share in shares for x in share) == tasks
    assert all(5 <= len(share) <= 6 for share in shares)
    monkeypatch.setattr(parallel, "SHARD", (0, 1))
    assert parallel.sharded(iter(tasks)) == tasks


@pytest.mark.parametrize("text", ["4/4", "1", "-1/4", "a/b", "0/0", "0/65", ""])
def test_a_shard_outside_its_range_is_one_line(text):
    with pytest.raises(pytest.UsageError, match=r"--shard=.*K/N with 0 <= K < N <= 64"):
        parse_shard(text)
    assert parse_shard("3/4") == (3, 4)
