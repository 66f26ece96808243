"""vLLM 0.29.0 keys a prompt's own partial tail twice under async
scheduling (``fuzz.results.known_classes``, ``async-tail-recache``): the
decode step after the prefill reached the tail t caches up to
``request.num_tokens``, which lacks the output still in flight, so t is
keyed again on the running block whose entry the copy-on-write had just
moved; the next step's copy-on-write copies that block after the decode
wrote t + 1 into it. A later request hitting t then resumes from a state
over t + 1 tokens (``resumed_state``): a wrong output, silently.

The stored finding (bench/rediscovery, 0.29.0 seed 5; Jamba, block 160,
unit 32, pool 91) needs its five requests: with fewer, the lookup finds
the first, right, copy of the key. Under ``--no-async-scheduling`` the
key is cached once. ``data/vllm-0.29.0-async-tail-recache.diff`` (no key
once the request computed past it: test data, not a fix kvspec proposes
for a release 0.32.0 replaced) ends it, hits unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_adapter.host import builds

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

DATA = Path(__file__).resolve().parent / "data"
FINDING = json.loads((DATA / "finding-async-tail-recache-jamba.json").read_text())


def _case(*extra: str) -> dict:
    case = json.loads(json.dumps(FINDING["case"]))
    case["deployment"]["vllm_args"].extend(extra)
    return case


def _resumed(obs: dict) -> list:
    return [(e.get("resumed_state") or {}).get("tokens") for e in obs["explain"]]


def test_under_async_a_later_request_resumes_a_state_past_the_key_and_under_sync_it_does_not(engine_029):
    looped = engine_029.run(_case())
    assert looped["hits"] == [0, 0, 0, 32, 384] and _resumed(looped)[4] == 385
    sync = engine_029.run(_case("--no-async-scheduling"))
    assert sync["hits"] == [0, 0, 0, 32, 384] and _resumed(sync)[4] == 384


@pytest.mark.slow
def test_keying_the_tail_once_ends_it_with_the_same_hits(engines):
    diff = str(DATA / "vllm-0.29.0-async-tail-recache.diff")
    engine = engines(builds.prepare("vllm==0.29.0", [diff]).removeprefix("vllm=="))
    fixed = engine.run(_case())
    assert fixed["hits"] == [0, 0, 0, 32, 384] and _resumed(fixed)[4] == 384
