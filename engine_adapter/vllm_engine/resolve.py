"""Resolve a deployment the way vLLM does, with vLLM's own code.

A deployment (``reference.deployment``) is a model config plus ``vllm serve``
flags and a platform. This module turns it into what vLLM would build, in
the engine environment of the version under test, on this CPU machine:

1. **Flags**: vLLM's own parser (``EngineArgs.add_cli_args``) reads
   ``vllm_args``; ``EngineArgs.from_cli_args(...).create_engine_config(
   UsageContext.OPENAI_API_SERVER)`` builds the ``VllmConfig`` as ``vllm
   serve`` does (defaults, validation, the hybrid-model config step that
   turns on Mamba align mode). A flag vLLM rejects is one line with vLLM's
   message.
2. **The worker's block-size step**: vLLM sets the final block size in each
   worker, after the model is built (``Platform.update_block_size_for_backend``
   -> ``_align_hybrid_block_size``). kvspec registers stand-in layers
   (``engine_adapter.vllm_engine.standins``) for the model's attention, Mamba and draft
   layers and calls the platform's own method: the interface's on cuda (CUDA
   does not override it), ``CpuPlatform``'s on cpu.
3. **KV-cache groups**: the stand-ins' specs go through vLLM's grouping and
   config functions (``get_global_kv_cache_groups`` / ``get_kv_cache_configs``,
   ``generate_scheduler_kv_cache_config``) and, as ``EngineCore`` does,
   ``cache_config.block_size`` = the smallest prefix-cacheable group block,
   ``resolve_kv_cache_block_sizes`` and (0.32+)
   ``resolve_cache_hit_alignment_tokens``.

A model is a hybrid (attention and Mamba groups) or attention-free (one
Mamba group: vLLM's single-group branch of ``resolve_kv_cache_block_sizes``
and its unitary coordinator). Whether an exception is vLLM refusing the
deployment (``DeploymentRejected``), vLLM crashing (``VllmFailure``, the
run's error, judged by ``engine_error``) or kvspec's own failure (re-raised
to the harness) is ``engine_adapter.vllm_engine.failure.vllm_outcome``'s rule, the same
in every step here and when the scheduler starts.

The answers kvspec gives to vLLM's hardware questions (``engine_adapter.vllm_engine.platform``)
and the attention backend it aligns with are reported as ``assumptions``.
Only ``engine_adapter`` imports vLLM; this module observes, it does not judge.

Its parts live beside it: the model config vLLM reads
(``engine_adapter.models.served``), ``EngineCore``'s KV-cache plan
and block sizes (``engine_adapter.vllm_engine.engine_core``), the
:class:`Resolution` and its case form (``engine_adapter.vllm_engine.resolution``).
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from engine_adapter.models.served import MAMBA_KIND, model_config_dict, model_dir
from engine_adapter.vllm_engine import platform as kplatform
from engine_adapter.vllm_engine.engine_core import engine_core_block_sizes, engine_core_handshake, kv_cache_configs
from engine_adapter.vllm_engine.failure import raise_outcome

# Names other modules import from here; their homes are the modules above.
from engine_adapter.vllm_engine.resolution import RESOLVER_VERSION, Resolution, check_limits, summary  # noqa: F401
from ground.errors import DeploymentRejected as VllmRejected
from ground.errors import KvspecError, Unsupported
from ground.printable import one_line
from reference.deployment import Deployment

MAMBA_BACKEND = {"gdn": "GDN_ATTN", "mamba2": "MAMBA2", "mamba1": "MAMBA1"}
#: Where the attention layers' backend is chosen on CUDA (vLLM's
#: ``_get_backend_priorities``): FLASH_ATTN on SM80/SM90, FLASHINFER on SM100
#: and for an fp8 KV cache on SM80. Every one of them has the same smallest
#: kernel block (16) and preferred block (16) for these models, so the
#: alignment uses ``FlashAttentionBackend``, which imports on CPU.
ALIGNMENT_BACKEND = "FLASH_ATTN"
#: Bytes of KV cache kvspec lets vLLM plan with: enough that nothing is ever
#: evicted in a serial trace (checked per case), small enough for the block pool.
MAX_BLOCKS = 200_000
#: Blocks per group of KV cache a deployment is resolved with by default
#: (kvspec's choice: a trace that needs more is resolved again with more).
DEFAULT_POOL_BLOCKS = 256
#: Resolutions this process keeps (:func:`resolve`), most recent last.
RESOLUTION_MEMO_SIZE = 256
_MEMO: dict[tuple[str, int], Resolution] = {}


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


_PARSER: list = []


def _serve_parser(engine_args, parser_class):
    """vLLM's ``vllm serve`` engine-argument parser, built once per process
    (~25 ms a build). Its defaults are objects it hands to every parse, and
    vLLM writes into some of them (0.33.0 ``EngineArgs`` puts
    ``--gdn-prefill-backend`` into the ``additional_config`` dict): a caller
    takes a deep copy of what it parses (:func:`_vllm_config`)."""
    if not _PARSER:
        _PARSER.append(engine_args.add_cli_args(parser_class(prog="vllm serve")))
    return _PARSER[0]


def _vllm_config(dep: Deployment, cfg_dir: Path):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # pragma: no cover
        from vllm.utils import FlexibleArgumentParser

    import contextlib
    import copy
    import io

    parser = _serve_parser(EngineArgs, FlexibleArgumentParser)
    argv = [
        "--model",
        str(cfg_dir),
        "--skip-tokenizer-init",
        "--load-format",
        "dummy",
        *with_drafter(dep.vllm_args, cfg_dir),
    ]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            ns = copy.deepcopy(parser.parse_args(argv))  # never the parser's own default objects (see _serve_parser)
    except SystemExit:
        lines = [x for x in said.getvalue().splitlines() if x.strip()]
        reason = lines[-1].split("error:", 1)[-1].strip() if lines else "refused"
        raise VllmRejected(
            f"deployment.vllm_args={shlex.join(dep.vllm_args)!r}: vLLM's `vllm serve` parser: {one_line(reason, 300)}"
        ) from None
    except Exception as e:
        raise_outcome(
            e,
            "config",
            f"deployment.vllm_args={shlex.join(dep.vllm_args)!r}: vLLM's `vllm serve` parser",
            phase="config",
        )
    try:
        args = EngineArgs.from_cli_args(ns)
        return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except KvspecError:
        raise
    except Exception as e:
        raise_outcome(e, "config", f"deployment={dep.describe()!r}: vLLM rejects it", phase="config")


def with_drafter(args: tuple[str, ...] | list[str], cfg_dir: Path) -> list[str]:
    """``args`` with kvspec's own drafter (``served.drafter_dir``: a
    one-layer EAGLE head sized to the target) as the ``model`` of an
    ``eagle``/``eagle3`` ``--speculative-config``: vLLM needs a drafter
    model for them ("num_speculative_tokens was provided but without
    speculative model"), and a deployment may not name one (the allow-list
    refuses the key). Other flags and methods pass as they are."""
    import json

    from engine_adapter.models.served import DRAFTER_METHODS, drafter_dir
    from reference.vllm_flags import canonical_flag

    out = list(args)
    for i, token in enumerate(out):
        if canonical_flag(token) != "--speculative-config":
            continue
        explicit = "=" in token
        at = i if explicit else i + 1
        if at >= len(out):
            break
        text = out[at].split("=", 1)[1] if explicit else out[at]
        try:
            doc = json.loads(text)
        except ValueError:
            break  # vLLM's parser says what is wrong with it
        if isinstance(doc, dict) and doc.get("method") in DRAFTER_METHODS and "model" not in doc:
            target = json.loads((cfg_dir / "config.json").read_text())
            doc["model"] = str(drafter_dir(target))
            value = json.dumps(doc)
            out[at] = f"{token.split('=', 1)[0]}={value}" if explicit else value
        break
    return out


def check_drafter_target(vc, dep: Deployment) -> None:
    """Whether the target can take the drafter. An EAGLE drafter on an
    attention-free model is Unsupported (kvspec's draft stand-in has the
    target's attention shape). EAGLE-3 reads the target's auxiliary hidden
    states: vLLM's worker
    refuses a target class without ``SupportsEagle3`` when it loads the
    model (0.33.0 ``gpu_model_runner._setup_eagle3_aux_hidden_state_outputs``:
    "Model does not support EAGLE3 interface but aux_hidden_state_outputs
    was requested"; kvspec's drafter keeps vLLM's default
    ``use_aux_hidden_state``). The same check, with vLLM's own
    ``supports_eagle3`` on the class its registry loads; a class that does
    not import on this machine is Unsupported, never guessed."""
    sc = vc.speculative_config
    if sc is not None and sc.method in ("eagle", "eagle3") and vc.model_config.is_attention_free:
        # the draft layer's stand-in takes the target's attention shape
        # (``standins.AttentionStandIn``), which an attention-free target has not
        raise Unsupported(
            f"deployment={dep.describe()!r}: an EAGLE drafter's attention layer beside an attention-free model's single Mamba group is outside kvspec's model; allowed: ngram, or a hybrid model"
        )
    if sc is None or sc.method != "eagle3":
        return
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry

    arch = vc.model_config.architecture
    cls = ModelRegistry._try_load_model_cls(arch)
    if cls is None:
        raise Unsupported(
            f"deployment={dep.describe()!r}: vLLM's {arch} class does not import on this machine, so whether it supports EAGLE-3 is not known here; allowed: another method"
        )
    if not supports_eagle3(cls):
        raise VllmRejected(
            f"deployment={dep.describe()!r}: vLLM rejects it when its worker loads the model: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested ({arch})"
        )


def layer_kinds(vc) -> list[str]:
    """``attention`` / ``mamba`` per decoder layer of the target model, read
    from the config fields vLLM's model class builds its layers from
    (vLLM 0.33.0: ``qwen3_next.py``/``qwen3_5.py``/``granitemoehybrid.py``
    ``layer_types``, ``nemotron_h.py`` ``hybrid_override_pattern`` (M, *),
    ``jamba.py`` ``layers_block_type``; ``falcon_h1.py`` runs attention and
    Mamba side by side in every layer; an attention-free model, ``mamba.py``
    and ``mamba2.py``, has a Mamba mixer in every layer). Layers with neither
    (MLP, MoE) are left out."""
    hf = vc.model_config.hf_text_config
    arch = vc.model_config.architecture
    if vc.model_config.is_attention_free:  # mamba.py, mamba2.py: a Mamba mixer in every layer
        return ["mamba"] * int(hf.num_hidden_layers)
    if arch == "FalconH1ForCausalLM":
        return ["mamba", "attention"] * int(hf.num_hidden_layers)
    if arch == "NemotronHForCausalLM":
        pattern = getattr(hf, "hybrid_override_pattern", None) or ""
        return [{"M": "mamba", "*": "attention"}[c] for c in pattern if c in "M*"]
    for key in ("layer_types", "layers_block_type"):
        types = getattr(hf, key, None)
        if types:
            out = []
            for t in types:
                if t in ("full_attention", "attention"):
                    out.append("attention")
                elif t in ("linear_attention", "mamba"):
                    out.append("mamba")
            return out
    return []


def _draft_attention_layers(vc) -> int:
    """The drafter's attention layers the worker registers: none for a
    proposer without drafter KV (``ngram``: vLLM sets its
    ``draft_model_config`` to the target's, but loads no drafter;
    ``SpeculativeConfig.uses_draft_kv_cache``)."""
    spec = vc.speculative_config
    if spec is None:
        return 0
    uses_kv = getattr(spec, "uses_draft_kv_cache", None)
    if (uses_kv is not None and not uses_kv()) or spec.method in ("ngram", "ngram_gpu", "suffix"):
        return 0
    draft = getattr(spec, "draft_model_config", None)
    if draft is None:
        return 0
    hf = draft.hf_config
    for key in ("n_predict", "num_nextn_predict_layers", "mtp_num_hidden_layers"):
        n = getattr(hf, key, None)
        if isinstance(n, int) and n > 0:
            return n
    return 1


def _gdn_prefill_backend(vc, dep: Deployment) -> str:
    """vLLM's choice of the Gated DeltaNet prefill kernel for this device."""
    try:
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import _resolve_gdn_prefill_backend
    except ImportError:
        try:
            from vllm.model_executor.models.qwen3_next import _resolve_gdn_prefill_backend  # type: ignore
        except ImportError:
            return "unknown"
    if dep.platform != "cuda":
        return _resolve_gdn_prefill_backend(vc)[1]
    with kplatform.as_cuda():
        return _resolve_gdn_prefill_backend(vc)[1]


def _attention_backend(dep: Deployment):
    if dep.platform == "cpu":
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return AttentionBackendEnum.CPU_ATTN.get_class(), "CPU_ATTN"
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    return FlashAttentionBackend, ALIGNMENT_BACKEND


def _install_layers(vc, dep: Deployment, version: tuple[int, ...], facts: dict) -> None:
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    from engine_adapter.vllm_engine.standins import CHECKPOINT_EXPORTERS, AttentionStandIn, MambaStandIn

    arch = vc.model_config.architecture
    kind = MAMBA_KIND.get(arch)
    if kind is None:
        raise Unsupported(
            f"deployment.model architecture={arch}: kvspec knows the Mamba layers of {', '.join(sorted(MAMBA_KIND))}"
        )
    kinds = layer_kinds(vc)
    n_attention, n_mamba = kinds.count("attention"), kinds.count("mamba")
    if n_mamba == 0 or (n_attention == 0 and not vc.model_config.is_attention_free):
        raise Unsupported(
            f"deployment.model architecture={arch}: {n_attention} attention and {n_mamba} Mamba layers in this config; kvspec checks hybrid models (both) and attention-free Mamba models"
        )
    backend, backend_name = _attention_backend(dep)
    facts.update(
        {
            "architecture": arch,
            "mamba_kind": kind,
            "attention_layers": n_attention,
            "mamba_layers": n_mamba,
            "attention_backend": backend_name,
        }
    )
    mamba_type = getattr(MambaAttentionBackendEnum, MAMBA_BACKEND[kind])
    alignment = None
    extra = None
    if kind == "gdn" and version >= (0, 30, 0) and "gdn_prefill_backend" not in facts:
        facts["gdn_prefill_backend"] = _gdn_prefill_backend(vc, dep)
    align_mode = vc.cache_config.mamba_cache_mode == "align"
    if align_mode and kind in CHECKPOINT_EXPORTERS and version >= CHECKPOINT_EXPORTERS[kind]:
        if kind == "mamba2":
            extra = {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}
        elif facts.get("gdn_prefill_backend") == "flashinfer":
            from vllm.model_executor.layers.mamba.abstract import get_mamba_prefill_checkpoint_grid
            from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT

            alignment = FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
            extra = lambda cfg: {
                "num_prefill_checkpoint_blocks": 1,
                "prefill_checkpoint_alignment": get_mamba_prefill_checkpoint_grid(cfg),
            }  # noqa: E731
    ctx = vc.compilation_config.static_forward_context
    ctx.clear()
    # Layer order: as a decoder stack registers them; only the draft layers'
    # position matters (vLLM 0.32.0 flags the group of the last-registered
    # layer for MTP), and they come last, as the drafter loads after the model.
    for i, kind in enumerate(kinds):
        if kind == "mamba":
            ctx[f"model.layers.{i}.mamba"] = MambaStandIn(vc, mamba_type, alignment, extra)
        else:
            ctx[f"model.layers.{i}.self_attn.attn"] = AttentionStandIn(backend)
    n_draft = _draft_attention_layers(vc)
    for j in range(n_draft):
        ctx[f"mtp.layers.{j}.self_attn.attn"] = AttentionStandIn(backend, is_draft=True)
    facts["draft_attention_layers"] = n_draft


def _update_block_size(vc, dep: Deployment) -> None:
    """The worker's step, with this platform's own method."""
    if dep.platform == "cpu" or kplatform.process_platform() == "native":
        from vllm.platforms import current_platform

        current_platform.update_block_size_for_backend(vc)
        return
    from vllm.platforms.interface import Platform

    Platform.update_block_size_for_backend(vc)


def resolve(dep: Deployment, *, num_blocks: int = DEFAULT_POOL_BLOCKS) -> Resolution:
    """What vLLM builds for ``dep`` (enough KV cache for ``num_blocks`` blocks
    per group). Raises VllmRejected / Unsupported / InvalidArgument, one line;
    VllmFailure where vLLM crashes (not refuses) resolving it.

    A process resolves each (deployment, pool size) once and keeps the
    result (:data:`RESOLUTION_MEMO_SIZE` of them): vLLM's parser, config and
    KV-cache planning are ~0.1 s a call, more than the scheduler's run of a
    case, and they are pure in the deployment (the same flags, model config,
    platform and device give the same objects; nothing kvspec or vLLM's
    scheduler runs writes to them afterwards, checked by
    tests/engine/test_resolve.py). The device is set again on every call,
    as the run that follows reads it. A refusal or a crash is not kept."""
    if dep.engine != "vllm":
        raise Unsupported(
            f"deployment.engine={dep.engine!r}: its flags are for another engine; allowed: vllm (run it with --engine {dep.engine}==X)"
        )
    kplatform.set_device(dep.device)
    key = (dep.key(), int(num_blocks))
    hit = _MEMO.pop(key, None)
    if hit is None:
        hit = _resolve(dep, num_blocks=num_blocks)
    _MEMO[key] = hit
    while len(_MEMO) > RESOLUTION_MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    return hit


def forget_resolutions() -> None:
    """Drop every resolution this process keeps: the next :func:`resolve`
    asks vLLM again (for a caller that has changed vLLM's functions, as a
    test that plants a crash in them does)."""
    _MEMO.clear()


def _resolve(dep: Deployment, *, num_blocks: int) -> Resolution:
    import vllm

    version = _version_tuple(vllm.__version__)
    here = kplatform.process_platform()
    if here == "native":  # vLLM's own platform on a real GPU serves cuda deployments
        here = "cuda"
    if dep.platform != here:
        raise Unsupported(
            f"deployment.platform={dep.platform}: this engine process runs the {here} platform; allowed: {here} (open the engine with platform={dep.platform})"
        )
    kplatform.set_device(dep.device)
    cfg = model_config_dict(dep)
    cfg_dir = model_dir(cfg)
    facts: dict[str, Any] = {"platform": dep.platform, "device": dep.device, "vllm_version": vllm.__version__}
    vc = _vllm_config(dep, cfg_dir)
    check_drafter_target(vc, dep)
    cc = vc.cache_config
    if not cc.enable_prefix_caching:
        raise Unsupported(
            f"deployment={dep.describe()!r}: prefix caching is off in vLLM {vllm.__version__} for this deployment; allowed: add --enable-prefix-caching"
        )
    if not (getattr(vc.model_config, "is_hybrid", False) or vc.model_config.is_attention_free):
        raise Unsupported(
            f"deployment.model architecture={vc.model_config.architecture}: vLLM treats it as neither hybrid nor attention-free; kvspec checks hybrid attention/Mamba models and attention-free Mamba models"
        )
    try:
        _install_layers(vc, dep, version, facts)
        _update_block_size(vc, dep)
        from engine_adapter.vllm_engine.standins import kv_cache_specs

        specs = kv_cache_specs(vc)
        page = max(s.page_size_bytes for s in specs.values())
        memory = page * len(specs) * min(max(num_blocks, 64), MAX_BLOCKS)
        # at least what vLLM asks for one request of max_model_len (its
        # KVCacheSpec.max_memory_usage_bytes, per layer, plus a sixteenth and
        # two blocks a layer for its grouped layout's rounding): a pool kvspec
        # sizes for its traces must not turn into vLLM's "larger than the
        # available KV cache memory" refusal of a deployment it serves (up
        # to MAX_BLOCKS a layer: past that vLLM's refusal stands)
        one_request = sum(int(s.max_memory_usage_bytes(vc)) for s in specs.values())
        memory = max(
            memory, min(one_request + one_request // 16 + 2 * page * len(specs), page * len(specs) * MAX_BLOCKS)
        )
        cfgs = kv_cache_configs(vc, specs, memory)
        import vllm.v1.core.kv_cache_utils as ku

        kcfg = ku.generate_scheduler_kv_cache_config(cfgs)
        sbs, hbs, alignment = engine_core_block_sizes(vc, kcfg, also=cfgs)
    except KvspecError:
        raise
    except Exception as e:
        raise_outcome(e, "kv_cache", f"deployment={dep.describe()!r}: vLLM fails to build its KV cache")
    mamba_specs = [s for s in specs.values() if type(s).__name__ == "MambaSpec"]
    facts.update(
        {
            "block_size": int(cc.block_size),
            "mamba_block_size": int(cc.mamba_block_size) if cc.mamba_block_size else None,
            "mamba_page_size_padded": cc.mamba_page_size_padded,
            # bytes of one Mamba layer's state page as the KV cache holds it (padding included)
            "mamba_page_size_bytes": max((int(s.page_size_bytes) for s in mamba_specs), default=None),
            # the blocks vLLM's start-up check budgets one request in a Mamba
            # group (max_memory_usage_bytes over the page: align mode 2 +
            # speculative + prefill checkpoint blocks, else 1 + speculative;
            # 0.33.0 kv_cache_interface.py:1135-1141): a pinned pool is sized on it
            "mamba_request_blocks": max(
                (int(s.max_memory_usage_bytes(vc)) // int(s.page_size_bytes) for s in mamba_specs), default=None
            ),
            "mamba_cache_mode": cc.mamba_cache_mode,
            "cache_dtype": cc.cache_dtype,
            "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
            "num_blocks": int(kcfg.num_blocks),
            **(
                {"num_gpu_blocks_override": int(cc.num_gpu_blocks_override)}
                if getattr(cc, "num_gpu_blocks_override", None) is not None
                else {}
            ),
            # the family-neutral fact the judge reads (fuzz.judge.oracles.before_pressure):
            # the deployment sized the pool, not kvspec (sized so nothing it needs is evicted)
            "pool_set_by_deployment": getattr(cc, "num_gpu_blocks_override", None) is not None,
            "async_scheduling": bool(getattr(vc.scheduler_config, "async_scheduling", False)),
            # --scheduling-policy as vLLM parsed it: the Scheduler kvspec builds
            # from this config picks its waiting queue by it (create_request_queue)
            "scheduling_policy": str(vc.scheduler_config.policy),
            "max_num_batched_tokens": int(vc.scheduler_config.max_num_batched_tokens),
            "num_hash_lookahead_tokens": int(getattr(vc, "num_hash_lookahead_tokens", 0) or 0),
            # the KV connector vLLM configured (--kv-offloading-size: the
            # native backend's OffloadingConnector), or None
            "kv_connector": getattr(getattr(vc, "kv_transfer_config", None), "kv_connector", None),
            "max_model_len": int(vc.model_config.max_model_len),
            "max_num_seqs": int(vc.scheduler_config.max_num_seqs),
            "long_prefill_token_threshold": int(getattr(vc.scheduler_config, "long_prefill_token_threshold", 0) or 0),
        }
    )
    assumptions = []
    if dep.platform == "cuda" and kplatform.process_platform() == "native":
        from vllm.platforms import current_platform

        assumptions.append(
            f"vLLM's hardware questions answered by its own {type(current_platform).__name__} (KVSPEC_PLATFORM=native)"
        )
        assumptions.append(
            f"attention aligned with {ALIGNMENT_BACKEND} (smallest kernel block 16, as FLASHINFER and TRITON_ATTN for these models)"
        )
    elif dep.platform == "cuda":
        assumptions.append(
            f"{dep.device}: vLLM's hardware questions answered for {kplatform.DEVICES[dep.device][2]} (compute capability {'.'.join(map(str, kplatform.DEVICES[dep.device][0]))})"
        )
        assumptions.append(
            f"attention aligned with {ALIGNMENT_BACKEND} (smallest kernel block 16, as FLASHINFER and TRITON_ATTN for these models)"
        )
    engine_core_handshake(vc, dep, facts, assumptions)
    res = Resolution(
        dep, vc, specs, kcfg, int(sbs), int(hbs), None if alignment is None else int(alignment), facts, assumptions
    )
    check_limits(res)
    return res


def pool_override(res: Resolution) -> int | None:
    """The pool size the deployment sets (``--num-gpu-blocks-override``, as
    vLLM parsed it: 0.33.0 ``CacheConfig.num_gpu_blocks_override``,
    config/cache.py:251), or None where vLLM sizes the pool from memory
    (kvspec's pool, sized so that nothing is evicted)."""
    value = getattr(res.vllm_config.cache_config, "num_gpu_blocks_override", None)
    return None if value is None else int(value)


def needed_blocks(trace_tokens: list[int], block: int, k: int = 0) -> int:
    """Blocks per group a serial trace needs without eviction."""
    return 16 + sum(math.ceil((n + k + 2) / block) + k + 4 for n in trace_tokens)
