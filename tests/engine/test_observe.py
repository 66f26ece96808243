"""The retained-state scan (engine_adapter.observe.RetainedScan) answers the
same with its incremental index of the block map as by asking the map for
every key, on the real vLLM 0.33.0 and 0.29.0 schedulers; and a write to
the map that bypasses the wrapped insert/pop makes it ask the map again."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine_adapter import environments
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json, random, sys
from engine_adapter import observe
from engine_adapter.driver import get_driver
from fuzz.generate import RandomChooser, build_case
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
    proc = subprocess.run([str(environments.env_python(version)), "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                          env=environments.worker_env(version), cwd=str(environments.REPO_ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(out["same"]) and len(out["same"]) == 18, out
    assert out["indexed"] >= 18 and out["kept"] > 20  # the index was built, and states were held
    assert out["valid_before"] is True and out["valid_after"] is False
