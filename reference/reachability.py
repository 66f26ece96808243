"""Could vLLM ever build a hand geometry? The rules a deployment's geometry
obeys, per vLLM version and platform.

A geometry written by hand is kvspec's choice, not vLLM's. Before anything
kvspec finds on it is called a vLLM bug, it must be one vLLM builds. These
are the rules every deployment's geometry satisfies (resolved with vLLM's own
code by ``engine_adapter.vllm_engine.resolve``; the lines cited are vLLM 0.33.0's):

* **one block size** (``platforms/interface.py`` ``_align_hybrid_block_size``):
  in Mamba align mode, the mode prefix caching turns on for every hybrid
  model, ``mamba_block_size = block_size``, and every full-attention layer
  uses ``block_size``; so every group has the same block B, which is also the
  scheduler block;
* **the kernel grid**: B is a multiple of the attention backend's smallest
  kernel block: 16 on CUDA (FLASH_ATTN, FLASHINFER, TRITON_ATTN), 32 on CPU
  (CPU_ATTN);
* **the hash unit** H is ``--prefix-match-unit`` (dividing B) or B; with a
  single KV cache group vLLM 0.32.0+ requires it to equal B
  (``kv_cache_utils.resolve_kv_cache_block_sizes``);
* **internal prefill checkpoints** come only from the layers that export
  them: Mamba-2 layers (0.32.0+, grid 1) and Qwen Gated DeltaNet layers on
  the FlashInfer prefill kernel (0.33.0 on CUDA, grid ``lcm(H, 64)`` with a
  prefix match unit, else B, and B a multiple of 64);
* ``--enable-mamba-shared-prefix-checkpoint`` exists from 0.32.0;
* the prefill split works in the KV block, except on CPU up to 0.32.0 where
  the engine core resets an unset block size to 128 after the KV cache is
  built (a split block below the KV block).

:func:`reachability` answers ``False`` with the first rule a geometry breaks,
or ``None`` when it breaks none (no contradiction; whether a shipped model
reaches it exactly is ``kvspec resolve --reachable``'s question). A
deployment's own geometry is reachable by construction.
"""

from __future__ import annotations

import math

from reference.case import Case, Geometry

KERNEL_GRID = {"cuda": 16, "cpu": 32}
GDN_CHECKPOINT_ALIGNMENT = 64


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+", 1)[0].split(".")[:3])


def geometry_reachability(g: Geometry, version: str, platform: str = "cuda") -> tuple[bool | None, str]:
    """(False, the rule broken) or (None, "no rule broken") for a hand geometry."""
    v = _v(version)
    sizes = sorted({x.block_size for x in g.groups})
    if len(sizes) > 1:
        return (
            False,
            f"groups have block sizes {sizes}: Mamba align mode on {platform} forces mamba_block_size = block_size = every attention block in vLLM {version} (platforms/interface.py _align_hybrid_block_size)",
        )
    (B,) = sizes
    if g.scheduler_block_size != B:
        return (
            False,
            f"scheduler_block_size={g.scheduler_block_size}: vLLM {version} schedules in the group block {B} (kv_cache_utils.resolve_kv_cache_block_sizes)",
        )
    grid = KERNEL_GRID.get(platform, 16)
    if B % grid:
        return (
            False,
            f"block_size={B}: not a multiple of {grid}, the smallest kernel block of the {platform} attention backends vLLM {version} picks for these models",
        )
    H = g.hash_block_size
    if g.num_groups == 1 and H != B and v >= (0, 32, 0):
        return (
            False,
            f"hash_block_size={H} with a single KV cache group: vLLM {version} requires it to equal the block {B}",
        )
    if not any(x.kind == "full_attention" for x in g.groups) or not any(x.kind == "mamba" for x in g.groups):
        return False, "a hybrid deployment has both full-attention and Mamba groups"
    ckpt = g.prefill_checkpoint_grid
    if ckpt is not None:
        allowed = set()
        if v >= (0, 32, 0):
            allowed.add(1)  # Mamba-2 layers (MambaMixer2.get_kv_cache_spec)
        if v >= (0, 33, 0) and platform == "cuda" and B % GDN_CHECKPOINT_ALIGNMENT == 0:
            allowed.add(math.lcm(g.prefix_match_unit, GDN_CHECKPOINT_ALIGNMENT) if g.prefix_match_unit else B)
        if ckpt not in allowed:
            return (
                False,
                f"prefill_checkpoint_grid={ckpt}: vLLM {version} layers export internal checkpoints on grids {sorted(allowed) or 'none'} for this geometry",
            )
    if g.split_block_size is not None and not (platform == "cpu" and v <= (0, 32, 0) and g.split_block_size == 128):
        return (
            False,
            f"split_block_size={g.split_block_size}: only vLLM's CPU engine core (up to 0.32.0) splits prefills on a block (its default 128) below the KV block",
        )
    if g.shared_prefix_checkpoint and v < (0, 32, 0):
        return False, f"shared_prefix_checkpoint: no such option in vLLM {version}"
    return None, "breaks none of vLLM's rules for a deployment's geometry"


def reachability(case: Case, version: str, platform: str = "cuda") -> dict:
    """``{"reachable": True|False|None, "reason": ...}`` for a case: a
    deployment is reachable by construction; a hand geometry by the rules."""
    if case.deployment is not None:
        return {
            "reachable": True,
            "kind": "deployment",
            "reason": f"resolved by vLLM's own code from {case.deployment.describe()}",
        }
    assert case.geometry is not None
    ok, why = geometry_reachability(case.geometry, version, platform)
    return {"reachable": ok, "kind": "synthetic", "reason": why}
