"""What ``EngineCore`` builds before it serves: configs, KV cache groups,
the scheduler and the request block hasher.

Two ways in:

* :func:`build_deployment` (a case with a ``deployment``): everything comes
  from vLLM's own code for that model and those flags
  (``engine_adapter.vllm_engine.resolve``), and the KV cache config is the one vLLM's
  grouping functions produced.
* :func:`build_hand` (a hand geometry): the KV cache groups are the case's,
  built as the GPU model runner would report them for a tiny Qwen3-Next-style
  model with those groups. That is kvspec's choice, not vLLM's: such a case
  is labelled with whether a deployment reaches it (``reachability``).

Both end in :func:`start_scheduler`, as ``EngineCore.__init__`` does. vLLM
raising here is a :class:`VllmFailure` (phase ``config`` / ``setup``), or a
refusal when the scheduler of a deployment starts; kvspec's own exceptions
go to the harness (``engine_adapter.vllm_engine.failure.vllm_outcome``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from pathlib import Path
from typing import Any, NoReturn

import torch
import vllm
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
)
from vllm.v1.structured_output import StructuredOutputManager

from engine_adapter.vllm_engine.connector import check_supported
from engine_adapter.vllm_engine.failure import VllmFailure, vllm_outcome
from engine_adapter.vllm_engine.resolve import engine_core_block_sizes
from ground.errors import KvspecError, Unsupported
from ground.files import write_text_if_changed
from ground.home import models_dir
from reference.case import EAGLE_METHODS, Case

VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 1 << 20
EAGLE_GROUP_MODES = ("auto", "all", "draft")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What the importable vLLM has, detected once (never by version string)."""

    version: str
    has_lookahead_hashes: bool
    has_is_draft: bool
    hasher_takes_lookahead: bool
    spec_fields: frozenset
    cache_fields: frozenset


def detect_capabilities() -> Capabilities:
    def names(cls) -> frozenset:
        if dataclasses.is_dataclass(cls):
            return frozenset(f.name for f in dataclasses.fields(cls))
        return frozenset(inspect.signature(cls).parameters)

    return Capabilities(
        version=vllm.__version__,
        has_lookahead_hashes=hasattr(VllmConfig, "num_hash_lookahead_tokens"),
        has_is_draft=_has_field(KVCacheSpec, "is_draft"),
        hasher_takes_lookahead=_accepts(kv_cache_utils.get_request_block_hasher, "num_hash_lookahead_tokens"),
        spec_fields=names(SpeculativeConfig),
        cache_fields=names(CacheConfig),
    )


def start_scheduler(caps: Capabilities, vllm_config, kv_cache_config, scheduler_block_size: int, hash_block_size: int):
    """``EngineCore.__init__``: the scheduler and the request block hasher.

    The class is the one ``EngineCore`` builds (vLLM 0.33.0 core.py:167,
    ``SchedulerConfig.get_scheduler_cls``, config/scheduler.py:231-238):
    ``AsyncScheduler`` where the deployment resolves ``async_scheduling``
    (0.33.0's default on CUDA, config/vllm.py:1685-1719; off with
    ``--no-async-scheduling``), else ``Scheduler``; the step loop then
    overlaps steps as ``EngineCore.step_with_batch_queue`` does
    (``engine_adapter.vllm_engine.steploop``)."""
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        include_finished_set=False,
        log_stats=True,
    )
    caching_hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(caching_hash_fn)
    hasher_args: list[Any] = [hash_block_size, caching_hash_fn]
    if caps.hasher_takes_lookahead:
        hasher_args.append(vllm_config.num_hash_lookahead_tokens)
    return scheduler, kv_cache_utils.get_request_block_hasher(*hasher_args)


def build_deployment(caps: Capabilities, case: Case, options: dict) -> dict:
    """What ``EngineCore`` builds for the case's deployment (vLLM's own
    resolution, ``engine_adapter.vllm_engine.resolve``), with a block pool sized so that
    nothing in the serial trace is ever evicted."""
    from engine_adapter.vllm_engine import resolve as R

    dep = case.deployment
    assert dep is not None
    k_max = 8
    longest = max(r.num_prompt_tokens + r.max_tokens for r in case.trace)
    # A first resolution (R.DEFAULT_POOL_BLOCKS) finds the block size; a
    # trace that needs more gets a second one, its need rounded up to a
    # power of two, so a campaign's cases share a few pool sizes (each
    # resolved once per process: R.resolve keeps them). The pool size is
    # kvspec's choice, never the GPU's: sized so that nothing is evicted,
    # the hits do not depend on it, and the scheduler's block pool, whose
    # construction is linear in its blocks, holds little more than that
    first = R.resolve(dep)
    block = first.scheduler_block_size
    need = R.needed_blocks(
        [r.num_prompt_tokens + r.max_tokens for r in case.trace],
        min(g.kv_cache_spec.block_size for g in first.kv_cache_config.kv_cache_groups),
        k_max,
    )
    # A deployment that sets the pool (--num-gpu-blocks-override) runs on the
    # pool vLLM sized from it (0.33.0 kv_cache_planning.py:1515-1530, 246-247):
    # a cache under pressure, evictions and preemptions its own
    pinned = R.pool_override(first) is not None
    res = (
        first
        if pinned or first.kv_cache_config.num_blocks >= need
        else R.resolve(dep, num_blocks=1 << max(0, need - 1).bit_length())
    )
    vc = res.vllm_config
    max_model_len = int(vc.model_config.max_model_len)
    if longest > max_model_len:
        raise Unsupported(
            f"trace: a request of {longest} tokens is above this deployment's max_model_len={max_model_len}; allowed: shorter prompts, or --max-model-len in deployment.vllm_args"
        )
    if res.kv_cache_config.num_blocks < need and not pinned:
        raise Unsupported(
            f"trace: needs {need} blocks per group without eviction; the deployment's pool has {res.kv_cache_config.num_blocks}; allowed: a shorter trace"
        )
    try:
        scheduler, hasher = start_scheduler(
            caps, vc, res.kv_cache_config, res.scheduler_block_size, res.hash_block_size
        )
    except KvspecError:
        raise
    except Exception as e:  # a ValueError: a setting vLLM validates when its engine starts (the retention interval against the resolved block)
        R.raise_outcome(e, "scheduler", f"deployment={dep.describe()!r}: vLLM refuses it when its scheduler starts")
    check_supported(scheduler)
    groups = list(res.kv_cache_config.kv_cache_groups)
    mamba_group_ids = [i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, MambaSpec)]
    return {
        "vllm_config": vc,
        "scheduler": scheduler,
        "hasher": hasher,
        "mamba_group_ids": mamba_group_ids,
        "hash_block_size": res.hash_block_size,
        "scheduler_block_size": res.scheduler_block_size,
        "alignment_tokens": res.alignment_tokens,
        "num_blocks": int(res.kv_cache_config.num_blocks),
        "max_model_len": max_model_len,
        "ignored_options": {},
        "groups": groups,
        "resolution": R.summary(res),
        "block": block,
    }


def hand_model_dir(num_attention: int, num_mamba: int) -> Path:
    """A local model directory holding only the ``config.json`` of a tiny
    Qwen3-Next-style hybrid with ``num_mamba`` linear-attention and
    ``num_attention`` full-attention layers and one MTP module."""
    path = models_dir() / f"qwen3-next-tiny-a{num_attention}-m{num_mamba}"
    cfg_path = path / "config.json"
    layer_types = ["linear_attention"] * num_mamba + ["full_attention"] * num_attention
    config = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": len(layer_types),
        "layer_types": layer_types,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
        "torch_dtype": "bfloat16",
        "bos_token_id": VOCAB_SIZE - 2,
        "eos_token_id": VOCAB_SIZE - 1,
    }
    write_text_if_changed(cfg_path, json.dumps(config, indent=2) + "\n")
    return path


def _has_field(cls: type, name: str) -> bool:
    try:
        return any(f.name == name for f in dataclasses.fields(cls))
    except TypeError:
        return name in inspect.signature(cls).parameters


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def speculative_kwargs(caps: Capabilities, case: Case) -> tuple[dict, dict]:
    """vLLM SpeculativeConfig kwargs for the case, and options left out.

    An option this vLLM lacks is dropped only when asking for it cannot
    change anything here: ``false`` (vLLM's default) or
    ``disable_lookahead_block_hashes: true`` on a version without
    lookahead hashes. Anything else is Unsupported, never guessed."""
    spec = case.speculative
    assert spec is not None
    kwargs: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    ignored: dict[str, Any] = {}
    for name, value in sorted(spec.options.items()):
        if name in caps.spec_fields:
            kwargs[name] = value
        elif value is False or (name == "disable_lookahead_block_hashes" and not caps.has_lookahead_hashes):
            ignored[name] = value
        else:
            raise Unsupported(f"speculative.{name}={value!r}: not an option of vLLM {caps.version}'s SpeculativeConfig")
    return kwargs, ignored


def _hand_failure(e: Exception, phase: str) -> NoReturn:
    """What vLLM raised building a hand geometry: a ``VllmFailure`` of
    ``phase`` when the exception is vLLM's (:func:`vllm_outcome`), else ``e``
    itself (kvspec's own bug, raised as it is)."""
    if vllm_outcome(e, "hand") is None:
        raise e
    raise VllmFailure(phase, e) from None


def build_hand(caps: Capabilities, case: Case, options: dict) -> dict:
    """What ``EngineCore`` builds for a hand geometry: the KV cache groups as
    the GPU model runner would report them for a tiny Qwen3-Next-style model
    with those groups (kvspec's choice, not vLLM's; ``reachable`` says
    whether any deployment builds the same)."""
    g = case.geometry
    spec = case.speculative
    k = spec.num_speculative_tokens if spec is not None else 0
    groups_flat = [grp for grp in g.groups for _ in range(grp.count)]
    num_attention = sum(1 for x in groups_flat if x.kind == "full_attention")
    num_mamba = sum(1 for x in groups_flat if x.kind == "mamba")
    longest = max(r.num_prompt_tokens + r.max_tokens for r in case.trace)
    max_model_len = max(8192, _round_up(longest + k + 16, 4096))
    if max_model_len > MAX_POSITION_EMBEDDINGS:
        raise Unsupported(
            f"trace: a request of {longest} tokens exceeds the adapter's max_model_len {MAX_POSITION_EMBEDDINGS}"
        )
    spec_kwargs, ignored = speculative_kwargs(caps, case) if spec is not None else ({}, {})
    if options.get("eagle_groups", "auto") not in EAGLE_GROUP_MODES:
        raise Unsupported(
            f"options.eagle_groups={options.get('eagle_groups')!r}: allowed: {', '.join(EAGLE_GROUP_MODES)}"
        )

    # -- configs, as `vllm serve <model> --enable-prefix-caching ...` builds them
    try:
        model_config = ModelConfig(
            model=str(hand_model_dir(num_attention, num_mamba)), skip_tokenizer_init=True, max_model_len=max_model_len
        )
        cache_kwargs: dict[str, Any] = {
            "block_size": min(x.block_size for x in g.groups),
            "enable_prefix_caching": True,
            "mamba_cache_mode": "align",
            "prefix_cache_retention_interval": g.retention_interval,
        }
        if g.shared_prefix_checkpoint:
            if "enable_mamba_shared_prefix_checkpoint" not in caps.cache_fields:
                raise Unsupported(
                    f"geometry.shared_prefix_checkpoint=true: not an option of vLLM {caps.version}'s CacheConfig"
                )
            cache_kwargs["enable_mamba_shared_prefix_checkpoint"] = True
        mamba_sizes = sorted({x.block_size for x in groups_flat if x.kind == "mamba"})
        if mamba_sizes:
            cache_kwargs["mamba_block_size"] = mamba_sizes[0]
        if g.prefix_match_unit is not None:
            cache_kwargs["prefix_match_unit"] = g.prefix_match_unit
        cache_config = CacheConfig(**cache_kwargs)
        parallel_config = ParallelConfig()
        scheduler_config = SchedulerConfig(
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            max_num_batched_tokens=g.max_num_batched_tokens,
            # Requests run one at a time; vLLM requires the token budget
            # to cover max_num_seqs, so keep it within a small budget.
            max_num_seqs=max(1, min(128, g.max_num_batched_tokens)),
            enable_chunked_prefill=True,
        )
        speculative_config = None
        if spec is not None:
            speculative_config = SpeculativeConfig(
                target_model_config=model_config, target_parallel_config=parallel_config, **spec_kwargs
            )
        vllm_config = VllmConfig(
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=parallel_config,
            scheduler_config=scheduler_config,
            speculative_config=speculative_config,
            device_config=DeviceConfig(device="cpu"),
        )
    except KvspecError:
        raise
    except Exception as e:
        _hand_failure(e, "config")

    # -- the KV cache groups, as the GPU model runner reports them for this geometry
    try:
        draft_layer = "mtp.layers.0.self_attn.attn"
        checkpoint_kwargs: dict[str, Any] = {}
        if g.prefill_checkpoint_grid is not None:
            mamba_fields = {f.name for f in dataclasses.fields(MambaSpec)}
            if "prefill_checkpoint_alignment" not in mamba_fields:
                raise Unsupported(
                    f"geometry.prefill_checkpoint_grid={g.prefill_checkpoint_grid}: vLLM {caps.version}'s MambaSpec has no prefill_checkpoint_alignment"
                )
            # what a checkpoint-exporting Mamba layer's get_kv_cache_spec adds
            checkpoint_kwargs = {
                "num_prefill_checkpoint_blocks": 1,
                "prefill_checkpoint_alignment": g.prefill_checkpoint_grid,
            }
        groups: list = []
        layer_specs: dict[str, Any] = {}
        mamba_group_ids: list[int] = []
        attn_i = mamba_i = 0
        for x in groups_flat:
            if x.kind == "full_attention":
                layer = f"model.layers.{num_mamba + attn_i}.self_attn.attn"
                attn_i += 1
                layer_spec = FullAttentionSpec(
                    block_size=x.block_size, num_kv_heads=2, head_size=16, dtype=torch.bfloat16
                )
                names = [layer]
                layer_specs[layer] = layer_spec
                if spec is not None and spec.method in EAGLE_METHODS and attn_i == 1:  # ngram: no drafter layer
                    names.append(draft_layer)
                    layer_specs[draft_layer] = (
                        dataclasses.replace(layer_spec, is_draft=True) if caps.has_is_draft else layer_spec
                    )
                groups.append(KVCacheGroupSpec(names, layer_spec))
            else:
                layer = f"model.layers.{mamba_i}.linear_attn"
                mamba_i += 1
                layer_spec = MambaSpec(
                    block_size=x.block_size,
                    shapes=((3, 96), (4, 16, 16)),
                    dtypes=(torch.bfloat16, torch.float32),
                    mamba_cache_mode="align",
                    num_speculative_blocks=k,
                    **checkpoint_kwargs,
                )
                layer_specs[layer] = layer_spec
                mamba_group_ids.append(len(groups))
                groups.append(KVCacheGroupSpec([layer], layer_spec))
        mark_eagle_groups(
            caps, vllm_config, speculative_config, groups, layer_specs, draft_layer, options.get("eagle_groups", "auto")
        )

        num_blocks = hand_num_blocks(case, groups_flat, k)
        kv_kwargs: dict[str, Any] = {"num_blocks": num_blocks, "kv_cache_tensors": [], "kv_cache_groups": groups}
        if _has_field(KVCacheConfig, "prefix_cache_retention_interval"):
            kv_kwargs["prefix_cache_retention_interval"] = cache_config.prefix_cache_retention_interval
        kv_cache_config = KVCacheConfig(**kv_kwargs)
        scheduler_block_size, hash_block_size, alignment_tokens = engine_core_block_sizes(vllm_config, kv_cache_config)
        # EngineCore.__init__
        scheduler, hasher = start_scheduler(caps, vllm_config, kv_cache_config, scheduler_block_size, hash_block_size)
    except KvspecError:
        raise
    except Exception as e:
        _hand_failure(e, "setup")
    return {
        "vllm_config": vllm_config,
        "scheduler": scheduler,
        "hasher": hasher,
        "mamba_group_ids": mamba_group_ids,
        "hash_block_size": hash_block_size,
        "scheduler_block_size": scheduler_block_size,
        "alignment_tokens": alignment_tokens,
        "num_blocks": num_blocks,
        "max_model_len": max_model_len,
        "ignored_options": ignored,
        "groups": groups,
        "resolution": None,
    }


def mark_eagle_groups(
    caps: Capabilities, vllm_config, speculative_config, groups, layer_specs, draft_layer, mode
) -> None:
    """Which groups take the EAGLE last-block drop, as the engine decides it.

    ``auto`` (default) does what this version's engine does for a
    Qwen3-Next MTP model: 0.33.0 flags the groups holding a draft layer
    (``get_global_kv_cache_groups``: the MTP attention layer joins the
    full-attention group); 0.29.0/0.30.0 flag only groups with a
    ``non_causal_multi_token_decode`` spec (``_annotate_eagle_groups``),
    none here, so the coordinator falls back to flagging every group.
    ``all`` flags none (the coordinator's flag-all fallback); ``draft``
    flags the draft layer's group on any version."""
    if speculative_config is None or mode == "all":
        return
    if mode == "draft":
        for grp in groups:
            grp.is_eagle_group = draft_layer in grp.layer_names
        return
    if caps.has_is_draft:
        drop = getattr(speculative_config, "use_eagle_block_drop", None)
        if drop is not None and drop():
            draft_names = {n for n, s in layer_specs.items() if getattr(s, "is_draft", False)}
            for grp in groups:
                grp.is_eagle_group = not draft_names.isdisjoint(grp.layer_names)
        return
    annotate = getattr(kv_cache_utils, "_annotate_eagle_groups", None)
    if annotate is not None:
        annotate(vllm_config, layer_specs, groups)


def hand_num_blocks(case: Case, groups_flat, k: int) -> int:
    """Enough blocks that nothing is ever evicted (the trace is serial and
    every finished request's blocks stay cached)."""
    total = 16
    for r in case.trace:
        n = r.num_prompt_tokens + r.max_tokens + k + 2
        for x in groups_flat:
            total += math.ceil(n / x.block_size) + k + 4
    return total
