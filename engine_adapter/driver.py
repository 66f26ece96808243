"""Drive the real vLLM scheduler over a case, with a simulated model.

This is the only kvspec module that imports vLLM. It builds what vLLM's
``EngineCore`` builds before serving (configs, the KV cache groups, the
scheduler, the request block hasher), then runs the case's trace serially:
each request is added, then ``schedule()`` -> a ``ModelRunnerOutput`` that
samples one token when a request's last prompt token has been computed ->
``update_from_output()``, until it finishes. Nothing in vLLM is edited: the
adapter reads vLLM objects and wraps a few *instance* methods to record what
they were called with and returned.

What is observed, per request (``explain``):

* ``hit`` / ``query``: the sum of ``prefix_cache_stats.hits`` / ``.queries``
  over every step's ``SchedulerStats`` (what ``vllm:prefix_cache_hits_total``
  / ``vllm:prefix_cache_queries_total`` grow by; ``update_from_output``
  resets the stats each step, so they are summed);
* ``scheduler_hit``, ``junction`` (``shared_prefix_boundary``): what
  ``KVCacheManager.get_computed_blocks`` returned at admission;
* ``boundaries``: the ``replay_boundaries`` the coordinator handed the Mamba
  managers' ``cache_blocks`` (0.30.0+; ``null`` before);
* ``chunk_ends``: ``num_computed_tokens`` after each prefill step;
* ``cache_blocks``: ``num_tokens`` of each Mamba ``cache_blocks`` call;
* ``retained_mamba_blocks``: per Mamba block size M, the indices i of this
  request's prompt states (the state after ``(i+1)*M`` tokens) that the block
  pool holds for every Mamba group once the request has finished.

The simulated model: the sampled token is always ``SAMPLED_TOKEN`` (1024),
outside the case token range [1, 1024), so an output token never extends a
shared prefix by accident; no draft tokens are proposed.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from engine_adapter.home import contain_this_process, models_dir

contain_this_process()
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from reference.case import Case, case_to_dict, parse_case, prompt_tokens  # noqa: E402
from reference.errors import KvspecError, Unsupported  # noqa: E402

VLLM_VERSION = vllm.__version__
#: The token the simulated model samples (outside every case stream).
SAMPLED_TOKEN = 1024
VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 1 << 20
#: Version of the result layout (``hits``, ``queries``, ``knobs``, ``explain``).
RESULT_SCHEMA = 1
EAGLE_GROUP_MODES = ("auto", "all", "draft")
_TRACEBACK_LIMIT = 20000


class VllmFailure(Exception):
    """vLLM raised (or misbehaved) while running a case: a finding, not a crash."""

    def __init__(self, phase: str, exc: BaseException | None = None, message: str | None = None, request: int | None = None):
        self.phase = phase
        self.exc = exc
        self.request = request
        self.tb = "".join(traceback.format_exception(exc))[-_TRACEBACK_LIMIT:] if exc is not None else None
        super().__init__(message or f"{type(exc).__name__}: {exc}")

    def as_dict(self) -> dict:
        return {
            "kind": "vllm",
            "phase": self.phase,
            "request": self.request,
            "type": type(self.exc).__name__ if self.exc is not None else "EngineStall",
            "message": str(self)[:2000],
            "traceback": self.tb,
        }


# ---------------------------------------------------------------- model directory


def model_dir(num_attention: int, num_mamba: int) -> Path:
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
    text = json.dumps(config, indent=2) + "\n"
    try:
        if cfg_path.read_text() == text:
            return path
    except OSError:
        pass
    path.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config.json.", suffix=".tmp", dir=path)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, cfg_path)
    return path


# ---------------------------------------------------------------- helpers


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


class _Recorder:
    """What the wrapped vLLM methods were called with / returned, per request."""

    def __init__(self) -> None:
        self.lookups: dict[str, list[tuple[int, int]]] = {}
        self.cache_calls: dict[str, list[dict]] = {}

    def wrap(self, scheduler: Scheduler, mamba_group_ids: list[int]) -> None:
        kvm = scheduler.kv_cache_manager
        original_lookup = kvm.get_computed_blocks

        def get_computed_blocks(request, *args, **kwargs):
            out = original_lookup(request, *args, **kwargs)
            try:
                num_tokens = int(out[1])
                spb = int(out[2]) if len(out) > 2 else None
                self.lookups.setdefault(request.request_id, []).append((num_tokens, spb))
            except Exception:  # observation must never change behaviour
                pass
            return out

        kvm.get_computed_blocks = get_computed_blocks
        managers = kvm.coordinator.single_type_managers
        for gid in mamba_group_ids[:1]:  # every Mamba group gets the same calls
            manager = managers[gid]
            original_cache = manager.cache_blocks

            def cache_blocks(request, num_tokens, *args, _orig=original_cache, **kwargs):
                try:
                    rb = kwargs.get("replay_boundaries")
                    self.cache_calls.setdefault(request.request_id, []).append(
                        {"num_tokens": int(num_tokens), "replay_boundaries": None if rb is None else [int(x) for x in rb]}
                    )
                except Exception:
                    pass
                return _orig(request, num_tokens, *args, **kwargs)

            manager.cache_blocks = cache_blocks


# ---------------------------------------------------------------- the driver


class VllmDriver:
    """Runs cases against the vLLM importable in this interpreter."""

    def __init__(self) -> None:
        self.version = VLLM_VERSION
        self.has_lookahead_hashes = hasattr(VllmConfig, "num_hash_lookahead_tokens")
        self.has_is_draft = _has_field(KVCacheSpec, "is_draft")
        self.hasher_takes_lookahead = _accepts(kv_cache_utils.get_request_block_hasher, "num_hash_lookahead_tokens")
        self.spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)} if dataclasses.is_dataclass(SpeculativeConfig) else set(inspect.signature(SpeculativeConfig).parameters)
        self.cache_fields = {f.name for f in dataclasses.fields(CacheConfig)} if dataclasses.is_dataclass(CacheConfig) else set(inspect.signature(CacheConfig).parameters)
        self.setup_seconds: list[float] = []

    # -------------------------------------------------------- options

    def _speculative_kwargs(self, case: Case) -> tuple[dict, dict]:
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
            if name in self.spec_fields:
                kwargs[name] = value
            elif value is False or (name == "disable_lookahead_block_hashes" and not self.has_lookahead_hashes):
                ignored[name] = value
            else:
                raise Unsupported(f"speculative.{name}={value!r}: not an option of vLLM {self.version}'s SpeculativeConfig")
        return kwargs, ignored

    # -------------------------------------------------------- setup

    def _build(self, case: Case, options: dict) -> dict:
        g = case.geometry
        spec = case.speculative
        k = spec.num_speculative_tokens if spec is not None else 0
        groups_flat = [grp for grp in g.groups for _ in range(grp.count)]
        num_attention = sum(1 for x in groups_flat if x.kind == "full_attention")
        num_mamba = sum(1 for x in groups_flat if x.kind == "mamba")
        longest = max(r.num_prompt_tokens + r.max_tokens for r in case.trace)
        max_model_len = max(8192, _round_up(longest + k + 16, 4096))
        if max_model_len > MAX_POSITION_EMBEDDINGS:
            raise Unsupported(f"trace: a request of {longest} tokens exceeds the adapter's max_model_len {MAX_POSITION_EMBEDDINGS}")
        spec_kwargs, ignored = self._speculative_kwargs(case) if spec is not None else ({}, {})
        if options.get("eagle_groups", "auto") not in EAGLE_GROUP_MODES:
            raise Unsupported(f"options.eagle_groups={options.get('eagle_groups')!r}: allowed: {', '.join(EAGLE_GROUP_MODES)}")

        # -- configs, as `vllm serve <model> --enable-prefix-caching ...` builds them
        try:
            model_config = ModelConfig(model=str(model_dir(num_attention, num_mamba)), skip_tokenizer_init=True, max_model_len=max_model_len)
            cache_kwargs: dict[str, Any] = {
                "block_size": min(x.block_size for x in g.groups),
                "enable_prefix_caching": True,
                "mamba_cache_mode": "align",
                "prefix_cache_retention_interval": g.retention_interval,
            }
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
                speculative_config = SpeculativeConfig(target_model_config=model_config, target_parallel_config=parallel_config, **spec_kwargs)
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
            raise VllmFailure("config", e) from None

        # -- the KV cache groups, as the GPU model runner reports them for this geometry
        try:
            draft_layer = "mtp.layers.0.self_attn.attn"
            groups: list = []
            layer_specs: dict[str, Any] = {}
            mamba_group_ids: list[int] = []
            attn_i = mamba_i = 0
            for x in groups_flat:
                if x.kind == "full_attention":
                    layer = f"model.layers.{num_mamba + attn_i}.self_attn.attn"
                    attn_i += 1
                    layer_spec = FullAttentionSpec(block_size=x.block_size, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
                    names = [layer]
                    layer_specs[layer] = layer_spec
                    if spec is not None and attn_i == 1:
                        names.append(draft_layer)
                        layer_specs[draft_layer] = dataclasses.replace(layer_spec, is_draft=True) if self.has_is_draft else layer_spec
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
                    )
                    layer_specs[layer] = layer_spec
                    mamba_group_ids.append(len(groups))
                    groups.append(KVCacheGroupSpec([layer], layer_spec))
            self._mark_eagle_groups(vllm_config, speculative_config, groups, layer_specs, draft_layer, options.get("eagle_groups", "auto"))

            num_blocks = self._num_blocks(case, groups_flat, k)
            kv_kwargs: dict[str, Any] = {"num_blocks": num_blocks, "kv_cache_tensors": [], "kv_cache_groups": groups}
            if _has_field(KVCacheConfig, "prefix_cache_retention_interval"):
                kv_kwargs["prefix_cache_retention_interval"] = cache_config.prefix_cache_retention_interval
            kv_cache_config = KVCacheConfig(**kv_kwargs)
            # EngineCore._initialize_kv_caches
            vllm_config.cache_config.num_gpu_blocks = num_blocks
            vllm_config.cache_config.block_size = min(grp.kv_cache_spec.block_size for grp in groups)
            if hasattr(vllm_config, "validate_block_size"):
                vllm_config.validate_block_size()
            scheduler_block_size, hash_block_size = kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
            alignment_tokens = None
            if hasattr(kv_cache_utils, "resolve_cache_hit_alignment_tokens"):
                alignment_tokens = kv_cache_utils.resolve_cache_hit_alignment_tokens(kv_cache_config, vllm_config, scheduler_block_size, hash_block_size)
                kv_cache_config.hash_block_size = hash_block_size
                kv_cache_config.cache_hit_alignment_tokens = alignment_tokens
            # EngineCore.__init__
            scheduler = Scheduler(
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
            if self.hasher_takes_lookahead:
                hasher_args.append(vllm_config.num_hash_lookahead_tokens)
            hasher = kv_cache_utils.get_request_block_hasher(*hasher_args)
        except KvspecError:
            raise
        except Exception as e:
            raise VllmFailure("setup", e) from None
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
        }

    def _mark_eagle_groups(self, vllm_config, speculative_config, groups, layer_specs, draft_layer, mode) -> None:
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
        if self.has_is_draft:
            drop = getattr(speculative_config, "use_eagle_block_drop", None)
            if drop is not None and drop():
                draft_names = {n for n, s in layer_specs.items() if getattr(s, "is_draft", False)}
                for grp in groups:
                    grp.is_eagle_group = not draft_names.isdisjoint(grp.layer_names)
            return
        annotate = getattr(kv_cache_utils, "_annotate_eagle_groups", None)
        if annotate is not None:
            annotate(vllm_config, layer_specs, groups)

    @staticmethod
    def _num_blocks(case: Case, groups_flat, k: int) -> int:
        """Enough blocks that nothing is ever evicted (the trace is serial and
        every finished request's blocks stay cached)."""
        total = 16
        for r in case.trace:
            n = r.num_prompt_tokens + r.max_tokens + k + 2
            for x in groups_flat:
                total += math.ceil(n / x.block_size) + k + 4
        return total

    # -------------------------------------------------------- run

    def knobs(self, built: dict) -> dict:
        s: Scheduler = built["scheduler"]
        vc: VllmConfig = built["vllm_config"]
        kvm = s.kv_cache_manager
        coord = kvm.coordinator
        spec = vc.speculative_config
        knobs = {
            "version": self.version,
            "eagle_drop": bool(kvm.use_eagle),
            "scheduler_use_eagle": bool(getattr(s, "use_eagle", False)),
            "hash_lookahead_tokens": int(getattr(s, "num_hash_lookahead_tokens", 0) or 0),
            "scheduler_block_size": int(s.block_size),
            "hash_block_size": int(getattr(s, "hash_block_size", built["hash_block_size"])),
            "alignment": int(getattr(coord, "_cache_hit_alignment_tokens", s.block_size)),
            "cache_hit_alignment_tokens": built["alignment_tokens"],
            "partial_hash_hits": bool(getattr(coord, "enable_partial_hash_hits", False)),
            "eagle_group_ids": sorted(int(i) for i in getattr(coord, "eagle_group_ids", ()) or ()),
            "drop_eagle_group_ids": sorted(int(i) for i in getattr(coord, "drop_eagle_group_ids", ()) or ()) if hasattr(coord, "drop_eagle_group_ids") else None,
            "mamba_drop_eagle_checkpoint_block": [bool(getattr(coord.single_type_managers[i], "drop_eagle_checkpoint_block", False)) for i in built["mamba_group_ids"]],
            "retention_interval": getattr(coord, "retention_interval", None),
            "cache_block_size": int(vc.cache_config.block_size),
            "max_num_scheduled_tokens": int(s.max_num_scheduled_tokens),
            "max_num_seqs": int(vc.scheduler_config.max_num_seqs),
            "num_lookahead_tokens": int(getattr(vc, "num_lookahead_tokens", 0) or 0),
            "num_prefill_lookahead_tokens": int(getattr(vc, "num_prefill_lookahead_tokens", 0) or 0) if hasattr(vc, "num_prefill_lookahead_tokens") else None,
            "use_eagle_block_drop": bool(spec.use_eagle_block_drop()) if spec is not None and hasattr(spec, "use_eagle_block_drop") else None,
            "use_v2_model_runner": bool(getattr(s, "use_v2_model_runner", False)),
            "coordinator": type(coord).__name__,
            "num_blocks": built["num_blocks"],
            "max_model_len": built["max_model_len"],
            "ignored_options": built["ignored_options"],
            "sampled_token": SAMPLED_TOKEN,
        }
        return knobs

    def run(self, case_or_dict: Case | dict, options: dict | None = None) -> dict:
        """Run a case. Returns the result dict; vLLM exceptions come back as
        ``{"error": {...}}`` (with the requests that finished before it);
        kvspec's own errors (InvalidArgument/Unsupported) are raised."""
        options = dict(options or {})
        case = case_or_dict if isinstance(case_or_dict, Case) else parse_case(case_or_dict)
        t0 = time.perf_counter()
        result: dict[str, Any] = {"engine": f"vllm=={self.version}", "hits": [], "queries": [], "knobs": None, "explain": []}
        try:
            built = self._build(case, options)
            result["knobs"] = self.knobs(built)
            setup = time.perf_counter() - t0
            self._trace(case, built, result, options)
        except VllmFailure as f:
            result["error"] = f.as_dict()
            setup = time.perf_counter() - t0
        result["timing"] = {"setup_s": round(setup, 4), "total_s": round(time.perf_counter() - t0, 4)}
        return result

    def _trace(self, case: Case, built: dict, result: dict, options: dict) -> None:
        s: Scheduler = built["scheduler"]
        rec = _Recorder()
        try:
            rec.wrap(s, built["mamba_group_ids"])
        except Exception as e:
            raise VllmFailure("setup", e) from None
        hasher = built["hasher"]
        hbs = built["hash_block_size"]
        pool = s.kv_cache_manager.block_pool
        cache_map = getattr(getattr(pool, "cached_block_hash_to_block", None), "_cache", None)
        make_key = getattr(kv_cache_utils, "make_block_hash_with_group_id", None)
        if not isinstance(cache_map, dict) or make_key is None:
            cache_map = None
        # vLLM keys a cached block by hash + group id; when that key is the
        # hash bytes followed by a fixed suffix (checked on a sample, per
        # group), build it inline: this scan runs over every hash of every
        # request.
        key_suffix: dict[int, bytes] = {}
        if cache_map is not None:
            sample = b"kvspec-key-probe"
            for gid in built["mamba_group_ids"]:
                try:
                    key = make_key(sample, gid)
                    if isinstance(key, bytes) and key.startswith(sample) and make_key(b"x", gid) == b"x" + key[len(sample):]:
                        key_suffix[gid] = bytes(key[len(sample):])
                except Exception:
                    pass
        mamba_gids = built["mamba_group_ids"]
        group_bs = {gid: built["groups"][gid].kv_cache_spec.block_size for gid in mamba_gids}
        for i, creq in enumerate(case.trace):
            tokens = prompt_tokens(creq)
            n = len(tokens)
            rid = f"req-{i}"
            try:
                req = VllmRequest(
                    request_id=rid,
                    prompt_token_ids=tokens,
                    sampling_params=SamplingParams(max_tokens=creq.max_tokens),
                    pooling_params=None,
                    block_hasher=hasher,
                )
                s.add_request(req)
            except Exception as e:
                raise VllmFailure("add_request", e, request=i) from None
            hits = queries = p_hits = p_queries = 0
            chunk_ends: list[int] = []
            steps = 0
            idle = 0
            max_steps = n + creq.max_tokens + 64
            while True:
                try:
                    if not s.has_unfinished_requests():
                        break
                    so = s.schedule()
                    scheduled = dict(so.num_scheduled_tokens)
                    req_ids = list(scheduled)
                    sampled = []
                    for sid in req_ids:
                        r = s.requests[sid]
                        sampled.append([SAMPLED_TOKEN] if r.num_computed_tokens >= r.num_tokens else [])
                    if rid in scheduled and req.num_computed_tokens <= n and (not chunk_ends or chunk_ends[-1] < req.num_computed_tokens) and req.num_output_tokens == 0:
                        chunk_ends.append(int(req.num_computed_tokens))
                    mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={x: j for j, x in enumerate(req_ids)}, sampled_token_ids=sampled)
                    outputs = s.update_from_output(so, mro)
                except Exception as e:
                    raise VllmFailure("step", e, request=i) from None
                steps += 1
                for eco in (outputs or {}).values():
                    stats = getattr(eco, "scheduler_stats", None)
                    pcs = getattr(stats, "prefix_cache_stats", None) if stats is not None else None
                    if pcs is not None:
                        hits += pcs.hits
                        queries += pcs.queries
                        p_hits += getattr(pcs, "preempted_hits", 0)
                        p_queries += getattr(pcs, "preempted_queries", 0)
                idle = idle + 1 if not scheduled else 0
                if idle > 8 or steps > max_steps:
                    raise VllmFailure("step", None, f"no progress: request {i} still unfinished after {steps} steps ({req.num_computed_tokens}/{n} prompt tokens computed)", request=i)
            lookups = rec.lookups.get(rid, [])
            calls = rec.cache_calls.get(rid, [])
            boundaries = None
            if any(c["replay_boundaries"] is not None for c in calls):
                boundaries = sorted({b for c in calls for b in (c["replay_boundaries"] or ()) if b > 0})
            retained_by_group = {}
            retained_tokens = {}
            hashes = list(req.block_hashes)
            for gid in mamba_gids:
                m = group_bs[gid]
                if cache_map is not None:  # the block pool's own dict, keyed as vLLM keys it
                    suffix = key_suffix.get(gid)
                    if suffix is not None:
                        pos = [(j + 1) * hbs for j, h in enumerate(hashes) if h + suffix in cache_map]
                    else:
                        pos = [(j + 1) * hbs for j, h in enumerate(hashes) if make_key(h, gid) in cache_map]
                else:
                    pos = [(j + 1) * hbs for j, h in enumerate(hashes) if pool.get_cached_block(h, [gid]) is not None]
                retained_tokens[gid] = pos
                retained_by_group[gid] = [p // m - 1 for p in pos if p % m == 0]
            by_size: dict[str, list[int]] = {}
            disagree = False
            for gid in mamba_gids:
                key = str(group_bs[gid])
                if key in by_size and by_size[key] != retained_by_group[gid]:
                    disagree = True
                    by_size[key] = sorted(set(by_size[key]) | set(retained_by_group[gid]))
                else:
                    by_size.setdefault(key, retained_by_group[gid])
            explain = {
                "request": i,
                "prompt_tokens": n,
                "hit": hits,
                "query": queries,
                "scheduler_hit": lookups[0][0] if lookups else None,
                "junction": (lookups[0][1] or 0) if lookups else None,
                "shared_prefix_boundary": lookups[0][1] if lookups else None,
                "lookups": len(lookups),
                "boundaries": boundaries,
                "chunk_ends": chunk_ends,
                "cache_blocks": [c["num_tokens"] for c in calls],
                "retained_mamba_blocks": by_size,
                "retained_mamba_tokens": {str(gid): retained_tokens[gid] for gid in mamba_gids} if any(p % group_bs[g] for g in mamba_gids for p in retained_tokens[g]) or disagree else None,
                "steps": steps,
            }
            if p_hits or p_queries:
                explain["preempted_hits"] = p_hits
                explain["preempted_queries"] = p_queries
            if disagree:
                explain["retained_mamba_by_group"] = {str(g): retained_by_group[g] for g in mamba_gids}
            result["hits"].append(hits)
            result["queries"].append(queries)
            result["explain"].append(explain)


def selftest_case() -> dict:
    """Three identical 3300-token requests, block 16, MTP K=2: exercises the
    MTP config (two model classes inspected) and the whole loop in well under
    a second. Every version hits on the third request (0.29.0 misses the
    second: the #53504 bug)."""
    return {
        "schema": 1,
        "name": "kvspec-selftest",
        "geometry": {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16, "count": 1}], "retention_interval": 0, "max_num_batched_tokens": 2048},
        "speculative": {"method": "mtp", "num_speculative_tokens": 2},
        "trace": [{"prompt": [{"segment": "selftest", "length": 3300}]}] * 3,
    }


_DRIVER: VllmDriver | None = None


def get_driver() -> VllmDriver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = VllmDriver()
    return _DRIVER


if __name__ == "__main__":  # python -m engine_adapter.driver CASE.json
    from reference.case import load_case

    print(json.dumps(get_driver().run(case_to_dict(load_case(sys.argv[1]))), indent=2))
