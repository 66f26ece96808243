"""Faults of kvspec's own, for the safety rules (issue 39), each written from
vLLM 0.33.0's source as a unified diff against the release and planted on
the fixed base (the release + every ``fixes/vllm-0.33.0-*.diff``), kept as
data under tests/engine/data/faults/:

* ``cap``: the lookup may cover the whole prompt
  (``kv_cache_manager.py:302,364``: ``num_tokens`` for ``num_tokens - 1``)
  and the scheduler then resumes one token short, as it does after a full
  async load (``scheduler.py:3515``): the request resumes from a state over
  more tokens than it computes with;
* ``keys``: lookahead block hashes wait for the lookahead token but leave
  it out of the key (``kv_cache_utils.py:1012-1018``): a block is hit by a
  request whose next token differs, so the drafter's KV there was computed
  for another token (``draft_keys``);
* ``state``: a running request's partial-tail hit stays keyed on the block
  the forward pass overwrites (``single_type_kv_cache_manager.py:1892``:
  the cache entry is not moved to the copy-on-write block that keeps the
  boundary state): the cache keys the state at the boundary (272) while the
  kernel writes the running state (288) there; the sibling's hit equals the
  promise, only ``resumed_state`` sees it (the stand-in writes where the
  kernel writes, ``engine_adapter.vllm_engine.forward``);
* ``connector``: the offloading connector's lookup loses its N - 1 cap
  (``offloading/scheduler.py:876``): an identical resend loads the whole
  prompt, resumes one token short from a state over all of it (``cap``;
  the load carries the stored fingerprint, so ``resumed_state`` too).
* ``async_decode``: under async scheduling the blocks a step's decoded
  tokens complete are no longer cached when its output is processed
  (``scheduler.py:2407-2411``: the ``has_output_placeholders`` branch
  dropped, left to ``allocate_slots`` at the next schedule): a request
  whose last computed token completes a block never caches it (the token
  is a placeholder when its step is scheduled, and no step follows), so
  the chat turn that quotes the output hits one block short (1088 for
  1632, ``promise``); sync scheduling caches it at schedule time.
* ``preempt``: a preempted request keeps its computed tokens
  (``scheduler.py:1822``: ``num_computed_tokens = 0`` dropped) while its
  blocks are freed, so it resumes at 1088 from a state slot no step wrote
  for it (``resumed_state``; the pinned pool of
  ``examples/pressure-preempted-and-resumed-qwen3_next.json``).
(The kernel-side checkpoint fault, the internal prefill checkpoint copied
one block column below, ``checkpoint.py:62``, is kept as data but has no
case: the deployments kvspec draws end their chunks at the boundary, so no
hit lands on an internal checkpoint.)

Each case is small; the same case on the fixed base raises no safety
oracle (no false alarm), and on the faulted build the oracle of its
category fires (``kvspec check-build`` at its default budget is the
acceptance figure; this is the fast check).
"""

from __future__ import annotations

import json

import pytest

from engine_adapter.host import builds
from fuzz.judge.oracle_registry import SAFETY_ORACLES
from fuzz.judge.verdict import observe_and_judge
from ground.home import REPO_ROOT
from reference.case import parse_case

pytestmark = [pytest.mark.engine]

FAULTS_DIR = REPO_ROOT / "tests" / "engine" / "data" / "faults"
FIXES = sorted(str(p) for p in (REPO_ROOT / "fixes").glob("vllm-0.33.0-*.diff"))
#: fault -> (its diff, the case that shows it, the oracles it must raise)
FAULTS = {
    "cap": ("vllm-0.33.0-cap-full-prompt-hit.diff", "cap-case.json", ("cap",)),
    "keys": ("vllm-0.33.0-keys-lookahead-left-out.diff", "keys-case.json", ("draft_keys",)),
    "state": ("vllm-0.33.0-state-partial-tail-key-left-on-running-block.diff", "state-case.json", ("resumed_state",)),
    "connector": ("vllm-0.33.0-connector-load-whole-prompt.diff", "connector-cap-case.json", ("cap", "resumed_state")),
    "preempt": ("vllm-0.33.0-preempt-keeps-computed-tokens.diff", "preempt-case.json", ("resumed_state",)),
    "async_decode": ("vllm-0.33.0-async-decode-cache-left-to-schedule.diff", "async-decode-case.json", ("promise",)),
}
#: Faults whose own build runs in the slow tier only (each is a patched build
#: and an engine start, minutes on a fresh clone; their fixed-base check stays
#: in the default tier, and ``kvspec check-build`` on each is the acceptance
#: figure, docs/judge.md).
SLOW_BUILDS = ("async_decode", "connector", "preempt", "state")


def _case(name: str):
    return parse_case(json.loads((FAULTS_DIR / FAULTS[name][1]).read_text()))


def _version(patches: list[str]) -> str:
    return builds.prepare("vllm==0.33.0", patches).removeprefix("vllm==")


@pytest.fixture(scope="module")
def fixed(engines):
    return engines(_version(FIXES))


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_the_fixed_base_raises_no_safety_oracle_on_the_faults_case(fixed, name):
    judged = observe_and_judge(_case(name), None, fixed)
    assert "error" not in judged.observation, judged.observation.get("error")
    assert not [d for d in judged.divergences if d.oracle in SAFETY_ORACLES], [
        (d.oracle, d.detail) for d in judged.divergences
    ]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_BUILDS else n for n in sorted(FAULTS)]
)
def test_each_planted_fault_is_caught_by_the_oracle_of_its_category(engines, name):
    diff, _case_file, oracles = FAULTS[name]
    engine = engines(_version([*FIXES, str(FAULTS_DIR / diff)]))
    judged = observe_and_judge(_case(name), None, engine)
    assert "error" not in judged.observation, judged.observation.get("error")
    fired = [d.oracle for d in judged.divergences]
    assert set(oracles) <= set(fired), [(d.oracle, d.detail) for d in judged.divergences]
    assert judged.verdict.verdict == "diverges"
