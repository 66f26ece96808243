"""The z3 boundary seeds find what plain random search misses: a planted
half fix (keeps only the longer sibling's boundary; an identical resend
misses only when S divides N and N >= 3S) on production geometry."""

from __future__ import annotations

import time

from fuzz.driving.campaign import Campaign
from fuzz.driving.drivers import run_cases, run_random
from spec.seeds import boundary_cases
from tests.conftest import MTP_DROP, hybrid, make_case
from tests.fuzz.doubles import HalfFixDouble

GEOMETRY_1600 = hybrid(1600, 1600)


def test_half_fix_double_fails_exactly_on_aligned_lengths_from_3S():
    engine = HalfFixDouble()
    for n, fails in (
        (3199, False),
        (3200, False),
        (3201, False),
        (4799, False),
        (4800, True),
        (4801, False),
        (8000, True),
    ):
        case = make_case(GEOMETRY_1600, [[("A", n)]] * 2, MTP_DROP)
        promise = (n - 1) // 1600 * 1600 - 1600
        assert (engine.run(case)["hits"][1] != max(promise, 0)) == fails, n


def test_z3_seeded_campaign_finds_the_half_fix_within_a_second(tmp_path):
    seeds = list(boundary_cases(("1600",), modes=("drop/0.30",)))
    campaign = Campaign(HalfFixDouble(), tmp_path, oracles=("promise",))
    start = time.monotonic()
    run_cases(campaign, seeds, stop_on_finding=True)
    assert campaign.stats.findings, "the z3 seeds include N = kS with k >= 3"
    assert campaign.stats.first_finding_s is not None and campaign.stats.first_finding_s <= 1.0
    assert time.monotonic() - start < 5


def test_plain_random_search_misses_the_half_fix(tmp_path):
    campaign = Campaign(HalfFixDouble(), tmp_path, oracles=("promise",))
    run_random(
        campaign, seed=1, max_time=30, max_execs=300, boundary_bias=False, geometry=GEOMETRY_1600, speculative=MTP_DROP
    )
    assert campaign.stats.execs >= 300
    assert campaign.stats.findings == []


def test_the_seed_folder_is_named_by_the_spec_and_reference_code(tmp_path, monkeypatch):
    """The z3 seeds' folder (``fuzz.draw.seeds.fingerprint``) changes with a file
    of spec/ or reference/, and not with code elsewhere."""
    import fuzz.draw.seeds as seeds

    for rel in ("spec/a.py", "reference/b.py", "fuzz/c.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    monkeypatch.setattr(seeds, "_ROOT", tmp_path)
    first = seeds.fingerprint()
    (tmp_path / "fuzz/c.py").write_text("x = 2\n")
    assert seeds.fingerprint() == first
    for rel in ("spec/a.py", "reference/b.py"):
        (tmp_path / rel).write_text("x = 3\n")
        assert seeds.fingerprint() != first
        first = seeds.fingerprint()
