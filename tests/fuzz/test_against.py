"""A campaign against a baseline (``check-build --against``), on TEST
DOUBLES (tests/fuzz/doubles.py): a finding the baseline shares on the same
case is known, one it does not is new, and the two never hide each other."""

from __future__ import annotations

import json

from fuzz.driving.campaign import Campaign, against_signature
from fuzz.driving.drivers import run_cases
from fuzz.judge.oracles import check_all
from fuzz.replaying.checkbuild import BuildReport, render
from tests.conftest import MTP_DROP, hybrid, make_case
from tests.fuzz.doubles import HalfFixDouble, ReferenceDouble

#: #53504's shape: the legacy rule misses the resend (request 1)
RESEND = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP)
#: a block-aligned prompt (3 blocks) resent: the half fix misses it
ALIGNED_RESEND = make_case(hybrid(32, 32), [[("A", 96)], [("A", 96)]], MTP_DROP)


def _findings(path):
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))]


def test_a_failure_the_baseline_shares_is_known(tmp_path):
    build, baseline = ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.29.0", "legacy")
    campaign = Campaign(build, tmp_path, baseline=baseline, oracles=("promise",), seed=1, shrink_calls=20)
    run_cases(campaign, [RESEND])
    (finding,) = _findings(tmp_path)
    assert finding["baseline"] == {"engine": "vllm==0.29.0", "fails_too": True}
    assert baseline.calls > 0 and check_all(RESEND, "0.29.0", baseline.run(RESEND), baseline.run, ("promise",))


def test_a_failure_the_baseline_does_not_share_is_new_and_shrinks_to_a_case_the_baseline_keeps(tmp_path):
    build, baseline = HalfFixDouble(), ReferenceDouble("0.30.0", "promise")
    campaign = Campaign(build, tmp_path, baseline=baseline, oracles=("promise",), seed=1, shrink_calls=40)
    run_cases(campaign, [ALIGNED_RESEND])
    (finding,) = _findings(tmp_path)
    assert finding["baseline"] == {"engine": "vllm==0.30.0", "fails_too": False}
    # the shrunk case still fails on the build and still holds on the baseline
    from reference.case import parse_case

    small = parse_case(finding["case"])
    assert check_all(small, "0.30.0", build.run(small), build.run, ("promise",))
    assert not check_all(small, "0.30.0", baseline.run(small), baseline.run, ("promise",))


def test_a_known_class_never_hides_a_new_failure_of_the_same_signature(tmp_path):
    """The same campaign sees the release's own bug first (known), then the
    same oracle on the same request kind where the baseline holds (new):
    both are written, under different signatures."""

    class Mixed(ReferenceDouble):
        """The legacy rule on long prompts (the baseline's bug too), the
        half fix on short ones (this build's own)."""

        def __init__(self):
            super().__init__("0.30.0", "promise")
            self.half = HalfFixDouble()
            self.legacy = ReferenceDouble("0.30.0", "legacy")

        def run(self, case):
            self.calls += 1
            short = max(r.num_prompt_tokens for r in case.trace) < 1000
            return (self.half if short else self.legacy).run(case)

    class Baseline(ReferenceDouble):
        def __init__(self):
            super().__init__("0.30.0", "promise")
            self.legacy = ReferenceDouble("0.30.0", "legacy")

        def run(self, case):
            self.calls += 1
            short = max(r.num_prompt_tokens for r in case.trace) < 1000
            return super().run(case) if short else self.legacy.run(case)

    campaign = Campaign(Mixed(), tmp_path, baseline=Baseline(), oracles=("promise",), seed=1, shrink_calls=0)
    long_resend = make_case(hybrid(32, 32), [[("A", 1024)]] * 2, MTP_DROP)  # aligned too: the same signature
    run_cases(campaign, [long_resend, ALIGNED_RESEND])
    found = {f["baseline"]["fails_too"]: f for f in _findings(tmp_path)}
    assert set(found) == {True, False}, [f["summary"] for f in _findings(tmp_path)]
    assert found[False]["signature"] == against_signature(found[True]["signature"])


def test_the_report_separates_new_from_known_and_the_exit_follows_what_is_new():
    report = BuildReport(
        "vllm==0.33.0+x.abc",
        against="vllm==0.33.0",
        known={"R2": "/tmp/r2.json"},
        rows=[
            {"promise": "R1", "name": "identical resend", "verdict": "pass"},
            {"promise": "R2", "name": "longer sibling", "verdict": "fails on baseline too"},
        ],
    )
    text = "\n".join(render(report))
    assert "against vllm==0.33.0" in text and "fails on baseline too" in text
    assert "failing on the baseline vllm==0.33.0 too" in text and "R2: /tmp/r2.json" in text
