"""The retained-state scan (engine_adapter.vllm_engine.observe.RetainedScan) answers the
same with its incremental index of the block map as by asking the map for
every key, on the real vLLM 0.33.0 and 0.29.0 schedulers; and a write to
the map that bypasses the wrapped insert/pop makes it ask the map again.
And the Mamba blocks a running request keeps below the state each step
starts from (explain ``block_table``): none on the release, a growing pile
when the manager is planted to give nothing back; and the block references
left once a request finished (explain ``leaked_blocks``): none on the
release, one when the pool is planted to keep one."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine_adapter.host import environments
from fuzz.judge.oracles import check_block_table
from reference.case import parse_case
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json, random, sys
from engine_adapter.vllm_engine import observe
from engine_adapter.vllm_engine.driver import get_driver
from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate import build_case
from reference.case import load_case, parse_case
sys.path.insert(0, "bench")
from engine import mixed_case, seed_case

driver = get_driver()
rng = random.Random(5)
cases = [parse_case(mixed_case()), parse_case(seed_case()), load_case("examples/seed-53504-deployment.json")]
cases += [build_case(RandomChooser(rng)) for _ in range(15)]
indexed = []
original = observe.RetainedScan._index
def counting(self):
    original(self)
    indexed.append(self.held is not None)
observe.RetainedScan._index = counting

def run_all(index_after):
    observe.RetainedScan.INDEX_AFTER = index_after
    out = []
    for c in cases:
        r = driver.run(c)
        r.pop("timing")
        out.append(r)
    return out

by_index, by_key = run_all(0), run_all(10 ** 12)
same = [a == b for a, b in zip(by_index, by_key)]

# a key written past insert/pop: the index is no longer trusted
observe.RetainedScan.INDEX_AFTER = 0
case = parse_case(mixed_case())
built = driver.build(case, {})
scan = observe.RetainedScan(built["scheduler"], built)
scan.positions([b"x" * 32])  # asks once, then indexes
before = scan._index_valid()
scan.cache_map[b"kvspec-bypass"] = None
after = scan._index_valid()
print(json.dumps({"same": same, "indexed": sum(indexed), "valid_before": before, "valid_after": after,
                  "kept": sum(1 for r in by_key for e in r["explain"] if any(e["retained_mamba_blocks"].values()))}))
"""


@pytest.mark.parametrize("version", ["0.33.0", "0.29.0"])
def test_the_index_answers_as_the_map_does(version):
    ensure_env(version)
    proc = subprocess.run(
        [str(environments.env_python(version)), "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        env=environments.worker_env(version),
        cwd=str(environments.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(out["same"]) and len(out["same"]) == 18, out
    assert out["indexed"] >= 18 and out["kept"] > 20  # the index was built, and states were held
    assert out["valid_before"] is True and out["valid_after"] is False


RETIRE = r"""
import json
from engine_adapter.vllm_engine.driver import get_driver
from reference.case import parse_case
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.single_type_kv_cache_manager import MambaManager

case = parse_case(json.loads(%r))
driver = get_driver()
release = driver.run(case)
remove = MambaManager.remove_skipped_blocks
MambaManager.remove_skipped_blocks = lambda self, *args, **kwargs: None  # planted: give nothing back
planted = driver.run(case)
MambaManager.remove_skipped_blocks = remove
get_new_blocks, taken = BlockPool.get_new_blocks, []
def leaky(self, num_blocks):  # planted: the first allocation takes one block more and keeps it
    blocks = get_new_blocks(self, num_blocks + (0 if taken else 1))
    if not taken:
        taken.append(blocks.pop())
    return blocks
BlockPool.get_new_blocks = leaky
leaked = driver.run(case)
print(json.dumps({"release": release, "planted": planted, "leaked": leaked}))
"""


def test_mamba_blocks_a_running_request_keeps_are_observed():
    """Qwen3-Next on an A100 (block 544), 1088-token chunks, vLLM 0.33.0:
    A:5000 then its resend hold no Mamba block below the state each step
    starts from and none they freed (explain ``block_table`` empty); with
    the manager's ``remove_skipped_blocks`` planted to give nothing back,
    A:5000's chunk-end states pile up and ``block_table`` fires. Once each
    request has finished the pool holds no block reference (explain
    ``leaked_blocks`` 0); with the pool planted to keep one block of the
    first allocation, A:5000 leaves one and ``block_table`` fires on it."""
    ensure_env("0.33.0")
    case = {
        "schema": 1,
        "deployment": {
            "model": "qwen3_next",
            "platform": "cuda",
            "device": "a100",
            "vllm_args": ["--enable-prefix-caching", "--max-num-batched-tokens", "1088"],
        },
        "trace": [
            {"prompt": [{"segment": "A", "length": 5000}], "max_tokens": 4},
            {"prompt": [{"segment": "A", "length": 5000}]},
        ],
    }
    proc = subprocess.run(
        [str(environments.env_python("0.33.0")), "-c", RETIRE % json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environments.worker_env("0.33.0"),
        cwd=str(environments.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    release, planted = out["release"], out["planted"]
    parsed = parse_case(case)
    assert [e["chunk_ends"] for e in release["explain"]][0] == [1088, 2176, 3264, 4352, 4896, 5000]
    assert [e["block_table"] for e in release["explain"]] == [[], []]
    assert check_block_table(parsed, "0.33.0", release) == []
    held = planted["explain"][0]["block_table"]
    assert held and held[0][0] == 2176 and held[-1][1] > held[0][1] and all(freed == 0 for _s, _u, freed in held), held
    (div,) = check_block_table(parsed, "0.33.0", planted)
    assert div.requests[0] == 0
    assert [e["leaked_blocks"] for e in release["explain"]] == [0, 0]
    leaked = out["leaked"]
    assert [e["leaked_blocks"] for e in leaked["explain"]] == [1, 1] and leaked["hits"] == release["hits"]
    (leak,) = check_block_table(parsed, "0.33.0", leaked)
    assert leak.requests == [0] and leak.context["leaked_blocks"] == [1, 0]
