"""The z3 boundary cases from ``spec/``, cached on disk as corpus inputs.

Computing them takes z3 some seconds; a campaign should not pay that each
time. They are written once (encoded with ``fuzz.draw.codec.encode``) into
``$KVSPEC_HOME/seeds/z3-<fingerprint>``, where the fingerprint hashes the
sources of ``spec/`` and ``reference/``, so a changed rule recomputes them.
The folder is complete only when its ``READY`` marker exists (written last).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fuzz.draw.codec import decode
from fuzz.driving.atheris_runner import write_seeds
from ground.files import hash_files
from reference.case import DEFAULT_MAX_NUM_BATCHED_TOKENS, Case, parse_case, request_to_dict
from reference.rescale import rescale_budget, rescale_interval, rescale_trace

_ROOT = Path(__file__).resolve().parents[2]


def fingerprint() -> str:
    """A digest of the code the z3 seeds are computed from (``spec/*.py``
    and ``reference/*.py``): their folder's name, so a change there
    computes them again."""
    h = hashlib.sha256()
    hash_files(h, _ROOT, ("spec/*.py", "reference/*.py"))
    return h.hexdigest()[:12]


def seed_dir(home: Path) -> Path:
    """The folder of encoded z3 seeds, computed on first use."""

    folder = home / "seeds" / f"z3-{fingerprint()}"
    if not (folder / "READY").exists():
        from spec.seeds import boundary_cases

        write_seeds(list(boundary_cases()), folder)
        (folder / "READY").write_text("complete\n")
    return folder


def load_seed_cases(folder: Path) -> list[Case]:
    return [
        decode(p.read_bytes()) for p in sorted(folder.iterdir()) if p.name != "READY" and not p.name.endswith(".tmp")
    ]


#: Deployments the z3 boundary cases are mapped onto, per speculative mode:
#: a real model and flags whose resolved geometry is uniform (attention =
#: Mamba = scheduler block B), the class the boundary cases are proved on.
SEED_DEPLOYMENTS = {
    "off": (
        {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "a100"},
        {"model": "nemotron_h", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "a100"},
        {
            "model": "qwen3_next",
            "vllm_args": ["--enable-prefix-caching", "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8"],
            "platform": "cuda",
            "device": "h100",
        },
    ),
    "drop": (
        {
            "model": "qwen3_next",
            "vllm_args": [
                "--enable-prefix-caching",
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":2,"disable_lookahead_block_hashes":true}',
            ],
            "platform": "cuda",
            "device": "a100",
        },
    ),
    "lookahead": (
        {
            "model": "qwen3_next",
            "vllm_args": [
                "--enable-prefix-caching",
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":2}',
            ],
            "platform": "cuda",
            "device": "a100",
        },
    ),
}


def _mode(case: Case) -> str | None:
    spec = case.speculative
    if spec is None:
        return "off"
    if spec.method != "mtp":
        return None
    return "drop" if spec.option("disable_lookahead_block_hashes") else "lookahead"


def on_deployment(case: Case, index: int, resolver) -> Case | None:
    """A z3 boundary case (a uniform hand geometry) mapped onto a real
    deployment: every length q*S + r becomes q*B + r' with r' in the same
    boundary class (0, +-1, +-2, else proportional), the chunk budget and a
    periodic interval scale with the block (``reference.rescale``), the
    speculative mode is the deployment's. None when the case is not
    uniform, its speculative mode has no deployment, or vLLM rejects every
    candidate."""
    g = case.geometry
    if g is None or case.deployment is not None:
        return None
    sizes = {x.block_size for x in g.groups}
    mode = _mode(case)
    if len(sizes) != 1 or g.prefix_match_unit is not None or mode is None or g.prefill_checkpoint_grid is not None:
        return None
    (S,) = sizes
    choices = SEED_DEPLOYMENTS[mode]
    dep = choices[index % len(choices)]
    info = resolver(dep)
    if not info:
        return None
    B = int(info["block"])
    trace = rescale_trace(case.trace, S, B)
    longest = max(r.num_prompt_tokens + r.max_tokens for r in trace)
    if info.get("max_model_len") and longest + 64 > int(info["max_model_len"]):
        return None
    args = list(dep["vllm_args"])
    budget = g.max_num_batched_tokens
    if budget != DEFAULT_MAX_NUM_BATCHED_TOKENS:
        budget = rescale_budget(budget, S, B)
    args += ["--max-num-batched-tokens", str(budget)]
    if budget < int(info.get("max_num_seqs") or 256):
        args += ["--max-num-seqs", str(max(1, min(16, budget)))]
    interval = g.retention_interval
    args += [
        "--prefix-cache-retention-interval",
        "None" if interval is None else str(rescale_interval(interval, S, B)),
    ]
    raw = {
        "schema": 1,
        "name": (case.name or "seed") + f"@{dep['model']}",
        "deployment": {**dep, "vllm_args": args},
        "trace": [request_to_dict(r) for r in trace],
    }
    return parse_case(json.loads(json.dumps(raw)))


def on_deployments(cases: list[Case], resolver, stop=None) -> list[Case]:
    """Every boundary case that maps onto a deployment (see ``on_deployment``),
    until ``stop()`` says the campaign's time is up (each mapping asks the
    engine to resolve a deployment: none is asked past the deadline)."""
    out = []
    for i, case in enumerate(cases):
        if stop is not None and stop():
            break
        mapped = on_deployment(case, i, resolver)
        if mapped is not None:
            out.append(mapped)
    return out


#: The KV connector a boundary case is also run with (vLLM's CPU
#: offloading, ``fuzz.draw.generate.CONNECTOR_MODES``): the caps and keys a hit
#: must keep hold for the sum of the local hit and a connector's load
#: (vLLM 0.33.0 ``Scheduler.schedule``, ``sched/scheduler.py:1138``; the
#: connector's own lookup caps at N - 1, ``offloading/scheduler.py:872-881``),
#: so every boundary length (q*B + 0, +-1, +-2) is a boundary of the load too.
CONNECTOR_ARGS = ("--kv-offloading-size", "4")


def with_connector(cases: list[Case]) -> list[Case]:
    """Each mapped boundary case whose deployment carries no KV connector,
    again with :data:`CONNECTOR_ARGS` (the name says so)."""
    out = []
    for case in cases:
        dep = case.deployment
        if dep is None or any(a.startswith("--kv-offloading") or a.startswith("--kv-transfer") for a in dep.vllm_args):
            continue
        raw = {
            "schema": 1,
            "name": (case.name or "seed") + "+offloading",
            "deployment": {**dep.as_dict(), "vllm_args": [*dep.vllm_args, *CONNECTOR_ARGS]},
            "trace": [request_to_dict(r) for r in case.trace],
        }
        out.append(parse_case(json.loads(json.dumps(raw))))
    return out
