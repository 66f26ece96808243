"""What vLLM's ``EngineCore`` does with the stand-in layers' specs: the
KV-cache plan (layout, groups, per-worker configs), the block sizes it
derives from the plan before the scheduler starts, and the config step its
start-up handshake re-runs. Called by ``engine_adapter.vllm_engine.resolve``
(and :func:`engine_core_block_sizes` by ``engine_adapter.vllm_engine.setup``).
"""

from __future__ import annotations

from engine_adapter.vllm_engine.failure import raise_outcome
from ground.errors import KvspecError
from reference.deployment import Deployment


def _resolve_layout(vc, specs: dict) -> None:
    """``EngineCore``: resolve the KV cache layout before grouping (vLLM
    versions that have ``resolve_kv_cache_layout``), from the backends of the
    registered layers."""
    try:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    except ImportError:
        return
    classes = []
    for layer in vc.compilation_config.static_forward_context.values():
        b = layer.get_attn_backend()
        if b not in classes:
            classes.append(b)
    resolve_kv_cache_layout(vc, [[x.name for x in get_supported_kv_cache_layouts(classes)]], list(specs.values()))


def kv_cache_configs(vc, specs: dict, memory: int):
    import vllm.v1.core.kv_cache_utils as ku

    try:
        import vllm.v1.core.kv_cache_planning as kp
    except ImportError:
        kp = None
    _resolve_layout(vc, specs)
    if kp is not None and hasattr(kp, "get_global_kv_cache_groups"):
        groups = kp.get_global_kv_cache_groups(vc, [specs])
        return kp.get_kv_cache_configs(vc, [specs], [memory], groups)
    return ku.get_kv_cache_configs(vc, [specs], [memory])


def engine_core_block_sizes(vllm_config, kv_cache_config, also=()) -> tuple[int, int, int | None]:
    """What vLLM's ``EngineCore`` does between the KV-cache plan and the
    scheduler (``_initialize_kv_caches``, then ``__init__``; 0.29.0-0.33.0):
    the cache config takes the pool's block count and the smallest
    prefix-cacheable group block, vLLM validates it, and
    ``resolve_kv_cache_block_sizes`` gives the scheduler block and the hash
    block; from 0.32.0 ``resolve_cache_hit_alignment_tokens`` gives the
    cache-hit alignment, written into the KV-cache config (and ``also``:
    the per-worker configs) as vLLM does. Returns (scheduler block, hash
    block, alignment or None)."""
    import vllm.v1.core.kv_cache_utils as kv_cache_utils

    cc = vllm_config.cache_config
    groups = kv_cache_config.kv_cache_groups
    cacheable = [g.kv_cache_spec.block_size for g in groups if getattr(g.kv_cache_spec, "prefix_cacheable", True)]
    cc.num_gpu_blocks = kv_cache_config.num_blocks
    cc.block_size = min(cacheable or [g.kv_cache_spec.block_size for g in groups])
    if hasattr(vllm_config, "validate_block_size"):
        vllm_config.validate_block_size()
    scheduler_block_size, hash_block_size = kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    alignment = None
    if hasattr(kv_cache_utils, "resolve_cache_hit_alignment_tokens"):
        alignment = kv_cache_utils.resolve_cache_hit_alignment_tokens(
            kv_cache_config, vllm_config, scheduler_block_size, hash_block_size
        )
        for c in (*also, kv_cache_config):
            c.hash_block_size = hash_block_size
            c.cache_hit_alignment_tokens = alignment
    return scheduler_block_size, hash_block_size, alignment


def engine_core_handshake(vc, dep: Deployment, facts: dict, assumptions: list[str]) -> None:
    """``vllm serve`` runs its engine core in a process of its own
    (``EngineCoreProc``), which re-runs ``VllmConfig.__post_init__()`` once
    the KV cache and the scheduler are built, at the end of its start-up
    handshake (``_perform_handshakes``, vLLM 0.29.0-0.33.0). The scheduler
    reads ``cache_config.block_size`` again at every align-mode chunk split
    (``_mamba_block_aligned_split``), so that re-run is part of what serves.

    It changes nothing on cuda, nor on cpu from 0.33.0 or with
    ``--block-size`` given; on cpu up to 0.32.0 ``CpuPlatform.
    check_and_update_config`` resets a block size the user did not set to
    its default 128, below a hybrid-aligned KV block (256 for the live
    server's model on a CPU with AVX512-BF16): chunks then end on 128-token
    boundaries while the KV cache blocks stay 256 (seen on the live server:
    an identical resend of a 1,470-token prompt misses once). The KV-cache
    geometry is unchanged; ``facts["chunk_split_block_size"]`` says which
    block the split uses."""
    cc = vc.cache_config
    before = int(cc.block_size)
    try:
        vc.__post_init__()
    except KvspecError:
        raise
    except Exception as e:
        raise_outcome(
            e,
            "config",
            f"deployment={dep.describe()!r}: vLLM's engine core fails its start-up config step",
            phase="config",
        )
    after = int(cc.block_size)
    facts["chunk_split_block_size"] = after
    if after != before:
        assumptions.append(
            f"engine core: VllmConfig.__post_init__ after the scheduler is built resets cache_config.block_size {before} -> {after} "
            f"(as `vllm serve` runs it); the align-mode prefill chunk split uses {after}, the KV cache blocks stay {before}"
        )
