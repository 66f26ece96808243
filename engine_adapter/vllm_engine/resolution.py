"""What a resolution is and how it reads as a case: the :class:`Resolution`
``engine_adapter.vllm_engine.resolve`` returns (vLLM's config and KV-cache
config for a deployment), the case limits it must fit (:func:`check_limits`),
its geometry and speculative settings in the case's own form
(:func:`case_parts`) and its JSON :func:`summary`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ground.errors import Unsupported
from reference.case import (
    MAX_BATCHED_TOKENS,
    MAX_BLOCK_SIZE,
    MAX_GROUPS,
    MAX_RETENTION_INTERVAL,
    MAX_SPECULATIVE_TOKENS,
    SPECULATIVE_METHODS,
)
from reference.deployment import Deployment

RESOLVER_VERSION = 1


@dataclass
class Resolution:
    """What vLLM built for a deployment."""

    deployment: Deployment
    vllm_config: Any
    specs: dict
    kv_cache_config: Any  # the scheduler's
    scheduler_block_size: int
    hash_block_size: int
    alignment_tokens: int | None
    facts: dict = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)

    @property
    def version(self) -> str:
        import vllm

        return vllm.__version__


def check_limits(res: Resolution) -> None:
    """Refuse (one line, ``Unsupported``) a resolution with a size outside
    ``reference.case``'s documented limits: a block (any group's, the
    scheduler's, the hash block, the match unit, the checkpoint grid, the
    split block, the hit alignment) above ``MAX_BLOCK_SIZE``, more than
    ``MAX_GROUPS`` groups, a retention interval, chunk budget or speculative
    token count above its limit. kvspec never prints, runs or stores a
    geometry a case could not hold (vLLM computes one from an extreme model
    config: a Mamba state page of gigabytes gives blocks of 10^9 tokens).
    Only sizes: whether vLLM's structural rules hold is vLLM's answer."""
    vc, kcfg = res.vllm_config, res.kv_cache_config
    groups = list(kcfg.kv_cache_groups)
    blocks = [
        ("scheduler_block_size", res.scheduler_block_size),
        ("hash_block_size", res.hash_block_size),
        ("cache_hit_alignment_tokens", res.alignment_tokens),
        ("prefix_match_unit", getattr(vc.cache_config, "prefix_match_unit", None)),
        ("split_block_size", res.facts.get("chunk_split_block_size")),
    ]
    blocks += [(f"groups[{i}].block_size", g.kv_cache_spec.block_size) for i, g in enumerate(groups)]
    blocks += [
        (f"groups[{i}].prefill_checkpoint_alignment", getattr(g.kv_cache_spec, "prefill_checkpoint_alignment", None))
        for i, g in enumerate(groups)
    ]
    sc = vc.speculative_config
    limits = [(name, value, MAX_BLOCK_SIZE) for name, value in blocks]
    limits += [
        ("groups", len(groups), MAX_GROUPS),
        (
            "retention_interval",
            getattr(
                kcfg,
                "prefix_cache_retention_interval",
                getattr(vc.cache_config, "prefix_cache_retention_interval", None),
            ),
            MAX_RETENTION_INTERVAL,
        ),
        (
            "max_num_batched_tokens",
            getattr(vc.scheduler_config, "max_num_scheduled_tokens", None)
            or vc.scheduler_config.max_num_batched_tokens,
            MAX_BATCHED_TOKENS,
        ),
        (
            "num_speculative_tokens",
            getattr(sc, "num_speculative_tokens", None) if sc is not None else None,
            MAX_SPECULATIVE_TOKENS,
        ),
    ]
    for name, value, top in limits:
        if isinstance(value, int) and not isinstance(value, bool) and value > top:
            raise Unsupported(
                f"deployment={res.deployment.describe()!r}: vLLM resolves {name}={value}, outside kvspec's documented case limits; allowed: at most {top:,}"
            )


def _group_kind(spec) -> str:
    name = type(spec).__name__
    if name == "MambaSpec":
        return "mamba"
    if name == "FullAttentionSpec":
        return "full_attention"
    raise Unsupported(f"KV cache group of {name}: outside kvspec's model (full attention and Mamba groups only)")


def case_parts(res: Resolution) -> tuple[dict, dict | None, dict]:
    """(geometry, speculative, checkpoint facts) in the case's own form."""
    vc = res.vllm_config
    threshold = int(getattr(vc.scheduler_config, "long_prefill_token_threshold", 0) or 0)
    if threshold > 0:
        raise Unsupported(
            f"long_prefill_token_threshold={threshold}: a second prefill chunk limit is outside kvspec's model; allowed: 0 (vLLM's default)"
        )
    groups: list[dict] = []
    for g in res.kv_cache_config.kv_cache_groups:
        kind = _group_kind(g.kv_cache_spec)
        bs = int(g.kv_cache_spec.block_size)
        if groups and groups[-1]["kind"] == kind and groups[-1]["block_size"] == bs:
            groups[-1]["count"] += 1
        else:
            groups.append({"kind": kind, "block_size": bs, "count": 1})
    kcfg = res.kv_cache_config
    retention = getattr(
        kcfg, "prefix_cache_retention_interval", getattr(vc.cache_config, "prefix_cache_retention_interval", 0)
    )
    pmu = getattr(vc.cache_config, "prefix_match_unit", None)
    grids = {
        getattr(g.kv_cache_spec, "prefill_checkpoint_alignment", None)
        for g in res.kv_cache_config.kv_cache_groups
        if type(g.kv_cache_spec).__name__ == "MambaSpec"
        and getattr(g.kv_cache_spec, "num_prefill_checkpoint_blocks", 0)
    }
    mamba_groups = [g for g in res.kv_cache_config.kv_cache_groups if type(g.kv_cache_spec).__name__ == "MambaSpec"]
    every = all(getattr(g.kv_cache_spec, "num_prefill_checkpoint_blocks", 0) for g in mamba_groups)
    grid = next(iter(grids)) if (every and len(grids) == 1) else None
    geometry = {
        "groups": groups,
        "hash_block_size": res.hash_block_size,
        "prefix_match_unit": pmu if pmu is not None and pmu != res.scheduler_block_size else None,
        "scheduler_block_size": res.scheduler_block_size,
        "retention_interval": retention,
        "max_num_batched_tokens": int(
            getattr(vc.scheduler_config, "max_num_scheduled_tokens", None) or vc.scheduler_config.max_num_batched_tokens
        ),
        "prefill_checkpoint_grid": int(grid) if grid is not None else None,
        "shared_prefix_checkpoint": bool(getattr(vc.cache_config, "enable_mamba_shared_prefix_checkpoint", False)),
        "split_block_size": _split_block(res),
    }
    spec = None
    sc = vc.speculative_config
    if sc is not None:
        method = sc.method
        if method not in SPECULATIVE_METHODS:
            raise Unsupported(f"speculative method={method}: outside kvspec's model ({', '.join(SPECULATIVE_METHODS)})")
        spec = {"method": method, "num_speculative_tokens": int(sc.num_speculative_tokens)}
        for name in ("disable_eagle_block_drop", "disable_lookahead_block_hashes"):
            value = getattr(sc, name, None)
            if isinstance(value, bool) and value:
                spec[name] = True
        if _legacy_hashes_kept(vc, sc):
            # vLLM 0.33.0 VllmConfig.num_hash_lookahead_tokens: 0 with a KV
            # connector ("KV connectors keep the legacy hashes"): the block
            # drop stays, as disable_lookahead_block_hashes has it
            spec["disable_lookahead_block_hashes"] = True
    checkpoints = {}
    for g in res.kv_cache_config.kv_cache_groups:
        s = g.kv_cache_spec
        if type(s).__name__ == "MambaSpec" and getattr(s, "num_prefill_checkpoint_blocks", 0):
            checkpoints = {
                "internal_prefill_checkpoints": True,
                "prefill_checkpoint_alignment": getattr(s, "prefill_checkpoint_alignment", None),
            }
            break
    return geometry, spec, checkpoints


def _legacy_hashes_kept(vc, sc) -> bool:
    """Whether this vLLM has lookahead block hashes (0.33.0+), the
    speculative method would use them (the EAGLE block drop in force, the
    option not set), and yet the engine hashes none
    (``num_hash_lookahead_tokens`` 0: a KV connector is set)."""
    if not hasattr(vc, "num_hash_lookahead_tokens") or getattr(sc, "disable_lookahead_block_hashes", None) is not False:
        return False
    drop = getattr(sc, "use_eagle_block_drop", None)
    return (
        callable(drop)
        and bool(drop())
        and bool(vc.cache_config.enable_prefix_caching)
        and int(vc.num_hash_lookahead_tokens) == 0
    )


def _split_block(res: Resolution) -> int | None:
    """The align-mode split's block when it is not the smallest group block."""
    split = res.facts.get("chunk_split_block_size")
    smallest = min(int(g.kv_cache_spec.block_size) for g in res.kv_cache_config.kv_cache_groups)
    return int(split) if split and int(split) != smallest else None


def summary(res: Resolution) -> dict:
    """The resolution as JSON: geometry, speculative, facts, assumptions."""
    geometry, spec, checkpoints = case_parts(res)
    return {
        "engine": f"vllm=={res.version}",
        "deployment": res.deployment.as_dict(),
        "geometry": geometry,
        "speculative": spec,
        "facts": {
            **res.facts,
            **checkpoints,
            "scheduler_block_size": res.scheduler_block_size,
            "hash_block_size": res.hash_block_size,
            "cache_hit_alignment_tokens": res.alignment_tokens,
        },
        "assumptions": res.assumptions,
        "resolver": RESOLVER_VERSION,
    }
