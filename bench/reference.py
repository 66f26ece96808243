"""Reference-model throughput: predictions per second for the seed case and
for a 50-request mixed trace (printed; no timed assertions)."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

# Run as a script, bench/ would be first on sys.path and this file would
# shadow the ``reference`` package: put the repository root there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from reference.case import parse_case  # noqa: E402
from reference.predict import predict  # noqa: E402

#: Both cases' geometry: one attention group and three Mamba groups, block 1600.
GROUPS = [{"kind": "full_attention", "block_size": 1600}, {"kind": "mamba", "block_size": 1600, "count": 3}]


def seed_case():
    return parse_case(
        {
            "schema": 1,
            "geometry": {"groups": GROUPS},
            "speculative": {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True},
            "trace": [{"prompt": [{"segment": "A", "length": 11910}]}] * 3,
        }
    )


def mixed_case(seed: int = 0, requests: int = 50):
    rng = random.Random(seed)
    trace = []
    for _ in range(requests):
        kind = rng.choice(["resend", "extend", "sibling", "fresh"])
        base = rng.choice("ABCD")
        n = rng.randrange(100, 12000)
        prompt = [{"segment": base, "length": n}]
        if kind in ("extend", "sibling"):
            prompt.append({"segment": rng.choice("XYZ") + str(rng.randrange(3)), "length": rng.randrange(1, 3000)})
        trace.append({"prompt": prompt})
    return parse_case(
        {
            "schema": 1,
            "geometry": {"groups": GROUPS, "retention_interval": 0},
            "speculative": {"method": "mtp", "num_speculative_tokens": 2},
            "trace": trace,
        }
    )


#: Predictions one rate measurement may make, a bound beside its seconds.
MAX_RUNS = 1_000_000


def rate(case, seconds: float = 2.0) -> tuple[float, int]:
    predict(case)  # warm the token streams
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds and n < MAX_RUNS:  # bounded by runs as well as time
        predict(case)
        n += 1
    return n / (time.perf_counter() - start), n


if __name__ == "__main__":
    for name, case in (("seed (3 requests)", seed_case()), ("mixed (50 requests)", mixed_case())):
        per_s, n = rate(case)
        print(f"{name:22s} {per_s:9.1f} predictions/s  ({per_s * len(case.trace):9.0f} requests/s, {n} runs)")
