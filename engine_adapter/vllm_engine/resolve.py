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
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from engine_adapter.vllm_engine import platform as kplatform
from ground.home import models_dir
from engine_adapter.vllm_engine.failure import VllmFailure, vllm_outcome
from engine_adapter.models import SHIPPED, load_config
from reference.case import MAX_BATCHED_TOKENS, MAX_BLOCK_SIZE, MAX_GROUPS, MAX_RETENTION_INTERVAL, MAX_SPECULATIVE_TOKENS
from ground.files import write_text_atomic
from reference.deployment import Deployment
from reference.model_config import check_model_config
from ground.errors import DeploymentRejected as VllmRejected
from ground.errors import InvalidArgument, KvspecError, Unsupported

#: vLLM architecture -> the kind of its Mamba-like layers.
MAMBA_KIND = {
    "Qwen3NextForCausalLM": "gdn",
    "Qwen3_5ForCausalLM": "gdn",
    "Qwen3_5MoeForCausalLM": "gdn",
    "NemotronHForCausalLM": "mamba2",
    "FalconH1ForCausalLM": "mamba2",
    "GraniteMoeHybridForCausalLM": "mamba2",
    "BambaForCausalLM": "mamba2",
    "JambaForCausalLM": "mamba1",
    # Attention-free: Mamba layers only, one KV cache group (vLLM's
    # ``MambaModelConfig`` turns on align mode with prefix caching).
    "Mamba2ForCausalLM": "mamba2",
    "FalconMambaForCausalLM": "mamba1",
    "MambaForCausalLM": "mamba1",
}
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
RESOLVER_VERSION = 1
#: Blocks per group of KV cache a deployment is resolved with by default
#: (kvspec's choice: a trace that needs more is resolved again with more).
DEFAULT_POOL_BLOCKS = 256
#: Resolutions this process keeps (:func:`resolve`), most recent last.
RESOLUTION_MEMO_SIZE = 256
_MEMO: dict[tuple[str, int], "Resolution"] = {}


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def vllm_message(e: BaseException) -> str:
    """vLLM's own words for an exception, on one line: a pydantic validation
    error gives its first message (and field), anything else its text."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            msg = str(first.get("msg", "")).removeprefix("Value error, ")
            loc = ".".join(str(x) for x in first.get("loc", ()) if x not in ("__root__",))
            return _one_line(f"{loc}: {msg}" if loc else msg)
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return _one_line(f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- model dir


def model_config_dict(dep: Deployment) -> dict:
    """The config.json the deployment serves: a shipped one or the user's,
    with ``model_overrides`` applied. Before vLLM reads it: no code-loading
    key (``auto_map``, ...), layers and dimensions within
    ``reference.model_config``'s limits, and ``architectures[0]`` one kvspec
    knows (``MAMBA_KIND``)."""
    if dep.model in SHIPPED:
        cfg = load_config(dep.model)
    else:
        path = Path(dep.model).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise InvalidArgument(f"deployment.model={dep.model!r}: neither a shipped model ({', '.join(SHIPPED)}) nor a readable config.json")
        try:
            if path.stat().st_size > 4 << 20:
                raise InvalidArgument(f"deployment.model={dep.model!r}: config.json above 4 MiB; allowed: a model config")
            cfg = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise InvalidArgument(f"deployment.model={dep.model!r}: not a JSON config ({_one_line(e, 120)})") from None
        if not isinstance(cfg, dict):
            raise InvalidArgument(f"deployment.model={dep.model!r}: config.json must hold an object")
        check_model_config(cfg, f"deployment.model={dep.model!r}: config.json field")
    cfg = dict(cfg)
    cfg.update(dep.model_overrides)
    check_model_config(cfg, "deployment model config")  # merged: also a Deployment built without parse_deployment
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise InvalidArgument(f"deployment.model={dep.model!r}: config.json has no architectures list; allowed: a Hugging Face model config")
    if archs[0] not in MAMBA_KIND:
        raise Unsupported(f"deployment.model architectures[0]={archs[0]!r}: not an architecture kvspec knows; allowed: {', '.join(sorted(MAMBA_KIND))}")
    return cfg


def check_case_model(case) -> None:
    """The model config of ``case``'s deployment (a user's config.json naming
    code, unreadable or too large; overrides merged), checked as
    :func:`model_config_dict` checks it, before any build or engine starts:
    the commands that take a case call it first, so a refusal is one line,
    exit 2, not found after an engine start. A hand geometry has none; an
    architecture kvspec does not know stays the run's to report."""
    if case.deployment is None or case.geometry is not None:
        return
    try:
        model_config_dict(case.deployment)
    except Unsupported:
        pass


def model_dir(cfg: dict) -> Path:
    """A folder holding ``cfg`` as config.json, keyed by its content (written
    atomically under kvspec's home)."""
    text = json.dumps(cfg, indent=1, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = models_dir() / f"deploy-{digest}"
    target = path / "config.json"
    if target.is_file():
        return path
    write_text_atomic(target, text)
    return path


# ---------------------------------------------------------------- resolution


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
    argv = ["--model", str(cfg_dir), "--skip-tokenizer-init", "--load-format", "dummy", *dep.vllm_args]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            ns = copy.deepcopy(parser.parse_args(argv))  # never the parser's own default objects (see _serve_parser)
    except SystemExit:
        lines = [x for x in said.getvalue().splitlines() if x.strip()]
        reason = lines[-1].split("error:", 1)[-1].strip() if lines else "refused"
        raise VllmRejected(f"deployment.vllm_args={shlex.join(dep.vllm_args)!r}: vLLM's `vllm serve` parser: {_one_line(reason, 300)}") from None
    except Exception as e:
        raise_outcome(e, "config", f"deployment.vllm_args={shlex.join(dep.vllm_args)!r}: vLLM's `vllm serve` parser", phase="config")
    try:
        args = EngineArgs.from_cli_args(ns)
        return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except KvspecError:
        raise
    except Exception as e:
        raise_outcome(e, "config", f"deployment={dep.describe()!r}: vLLM rejects it", phase="config")


def raise_outcome(e: Exception, where: str, refused: str, phase: str = "setup") -> NoReturn:
    """Raise what ``e`` is (``engine_adapter.vllm_engine.failure.vllm_outcome``): vLLM
    refusing (``VllmRejected``, ``refused: <vLLM's words>``), vLLM crashing
    (``VllmFailure`` of ``phase``), or kvspec's own error (``e`` itself)."""
    outcome = vllm_outcome(e, where)
    if outcome == "refused":
        raise VllmRejected(f"{refused}: {vllm_message(e)}") from None
    if outcome == "crashed":
        raise VllmFailure(phase, e) from None
    raise e


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
    spec = vc.speculative_config
    if spec is None:
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
        raise Unsupported(f"deployment.model architecture={arch}: kvspec knows the Mamba layers of {', '.join(sorted(MAMBA_KIND))}")
    kinds = layer_kinds(vc)
    n_attention, n_mamba = kinds.count("attention"), kinds.count("mamba")
    if n_mamba == 0 or (n_attention == 0 and not vc.model_config.is_attention_free):
        raise Unsupported(f"deployment.model architecture={arch}: {n_attention} attention and {n_mamba} Mamba layers in this config; kvspec checks hybrid models (both) and attention-free Mamba models")
    backend, backend_name = _attention_backend(dep)
    facts.update({"architecture": arch, "mamba_kind": kind, "attention_layers": n_attention, "mamba_layers": n_mamba, "attention_backend": backend_name})
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
            extra = lambda cfg: {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": get_mamba_prefill_checkpoint_grid(cfg)}  # noqa: E731
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


def _kv_cache_configs(vc, specs: dict, memory: int):
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
        raise Unsupported(f"deployment.platform={dep.platform}: this engine process runs the {here} platform; allowed: {here} (open the engine with platform={dep.platform})")
    kplatform.set_device(dep.device)
    cfg = model_config_dict(dep)
    cfg_dir = model_dir(cfg)
    facts: dict[str, Any] = {"platform": dep.platform, "device": dep.device, "vllm_version": vllm.__version__}
    vc = _vllm_config(dep, cfg_dir)
    cc = vc.cache_config
    if not cc.enable_prefix_caching:
        raise Unsupported(f"deployment={dep.describe()!r}: prefix caching is off in vLLM {vllm.__version__} for this deployment; allowed: add --enable-prefix-caching")
    if not (getattr(vc.model_config, "is_hybrid", False) or vc.model_config.is_attention_free):
        raise Unsupported(f"deployment.model architecture={vc.model_config.architecture}: vLLM treats it as neither hybrid nor attention-free; kvspec checks hybrid attention/Mamba models and attention-free Mamba models")
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
        memory = max(memory, min(one_request + one_request // 16 + 2 * page * len(specs), page * len(specs) * MAX_BLOCKS))
        cfgs = _kv_cache_configs(vc, specs, memory)
        import vllm.v1.core.kv_cache_utils as ku

        kcfg = ku.generate_scheduler_kv_cache_config(cfgs)
        sbs, hbs, alignment = engine_core_block_sizes(vc, kcfg, also=cfgs)
    except KvspecError:
        raise
    except Exception as e:
        raise_outcome(e, "kv_cache", f"deployment={dep.describe()!r}: vLLM fails to build its KV cache")
    facts.update({
        "block_size": int(cc.block_size),
        "mamba_block_size": int(cc.mamba_block_size) if cc.mamba_block_size else None,
        "mamba_page_size_padded": cc.mamba_page_size_padded,
        # bytes of one Mamba layer's state page as the KV cache holds it (padding included)
        "mamba_page_size_bytes": max((int(s.page_size_bytes) for s in specs.values() if type(s).__name__ == "MambaSpec"), default=None),
        "mamba_cache_mode": cc.mamba_cache_mode,
        "cache_dtype": cc.cache_dtype,
        "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
        "num_blocks": int(kcfg.num_blocks),
        "async_scheduling": bool(getattr(vc.scheduler_config, "async_scheduling", False)),
        "max_num_batched_tokens": int(vc.scheduler_config.max_num_batched_tokens),
        "num_hash_lookahead_tokens": int(getattr(vc, "num_hash_lookahead_tokens", 0) or 0),
        "max_model_len": int(vc.model_config.max_model_len),
        "max_num_seqs": int(vc.scheduler_config.max_num_seqs),
        "long_prefill_token_threshold": int(getattr(vc.scheduler_config, "long_prefill_token_threshold", 0) or 0),
    })
    assumptions = []
    if dep.platform == "cuda" and kplatform.process_platform() == "native":
        from vllm.platforms import current_platform

        assumptions.append(f"vLLM's hardware questions answered by its own {type(current_platform).__name__} (KVSPEC_PLATFORM=native)")
        assumptions.append(f"attention aligned with {ALIGNMENT_BACKEND} (smallest kernel block 16, as FLASHINFER and TRITON_ATTN for these models)")
    elif dep.platform == "cuda":
        assumptions.append(f"{dep.device}: vLLM's hardware questions answered for {kplatform.DEVICES[dep.device][2]} (compute capability {'.'.join(map(str, kplatform.DEVICES[dep.device][0]))})")
        assumptions.append(f"attention aligned with {ALIGNMENT_BACKEND} (smallest kernel block 16, as FLASHINFER and TRITON_ATTN for these models)")
    _engine_core_handshake(vc, dep, facts, assumptions)
    res = Resolution(dep, vc, specs, kcfg, int(sbs), int(hbs), None if alignment is None else int(alignment), facts, assumptions)
    check_limits(res)
    return res


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
    blocks = [("scheduler_block_size", res.scheduler_block_size), ("hash_block_size", res.hash_block_size), ("cache_hit_alignment_tokens", res.alignment_tokens),
              ("prefix_match_unit", getattr(vc.cache_config, "prefix_match_unit", None)), ("split_block_size", res.facts.get("chunk_split_block_size"))]
    blocks += [(f"groups[{i}].block_size", g.kv_cache_spec.block_size) for i, g in enumerate(groups)]
    blocks += [(f"groups[{i}].prefill_checkpoint_alignment", getattr(g.kv_cache_spec, "prefill_checkpoint_alignment", None)) for i, g in enumerate(groups)]
    sc = vc.speculative_config
    limits = [(name, value, MAX_BLOCK_SIZE) for name, value in blocks]
    limits += [("groups", len(groups), MAX_GROUPS),
               ("retention_interval", getattr(kcfg, "prefix_cache_retention_interval", getattr(vc.cache_config, "prefix_cache_retention_interval", None)), MAX_RETENTION_INTERVAL),
               ("max_num_batched_tokens", getattr(vc.scheduler_config, "max_num_scheduled_tokens", None) or vc.scheduler_config.max_num_batched_tokens, MAX_BATCHED_TOKENS),
               ("num_speculative_tokens", getattr(sc, "num_speculative_tokens", None) if sc is not None else None, MAX_SPECULATIVE_TOKENS)]
    for name, value, top in limits:
        if isinstance(value, int) and not isinstance(value, bool) and value > top:
            raise Unsupported(f"deployment={res.deployment.describe()!r}: vLLM resolves {name}={value}, outside kvspec's documented case limits; allowed: at most {top:,}")


def _engine_core_handshake(vc, dep: Deployment, facts: dict, assumptions: list[str]) -> None:
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
        raise_outcome(e, "config", f"deployment={dep.describe()!r}: vLLM's engine core fails its start-up config step", phase="config")
    after = int(cc.block_size)
    facts["chunk_split_block_size"] = after
    if after != before:
        assumptions.append(
            f"engine core: VllmConfig.__post_init__ after the scheduler is built resets cache_config.block_size {before} -> {after} "
            f"(as `vllm serve` runs it); the align-mode prefill chunk split uses {after}, the KV cache blocks stay {before}"
        )


# ---------------------------------------------------------------- case form


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
        raise Unsupported(f"long_prefill_token_threshold={threshold}: a second prefill chunk limit is outside kvspec's model; allowed: 0 (vLLM's default)")
    groups: list[dict] = []
    for g in res.kv_cache_config.kv_cache_groups:
        kind = _group_kind(g.kv_cache_spec)
        bs = int(g.kv_cache_spec.block_size)
        if groups and groups[-1]["kind"] == kind and groups[-1]["block_size"] == bs:
            groups[-1]["count"] += 1
        else:
            groups.append({"kind": kind, "block_size": bs, "count": 1})
    kcfg = res.kv_cache_config
    retention = getattr(kcfg, "prefix_cache_retention_interval", getattr(vc.cache_config, "prefix_cache_retention_interval", 0))
    pmu = getattr(vc.cache_config, "prefix_match_unit", None)
    grids = {getattr(g.kv_cache_spec, "prefill_checkpoint_alignment", None) for g in res.kv_cache_config.kv_cache_groups if type(g.kv_cache_spec).__name__ == "MambaSpec" and getattr(g.kv_cache_spec, "num_prefill_checkpoint_blocks", 0)}
    mamba_groups = [g for g in res.kv_cache_config.kv_cache_groups if type(g.kv_cache_spec).__name__ == "MambaSpec"]
    every = all(getattr(g.kv_cache_spec, "num_prefill_checkpoint_blocks", 0) for g in mamba_groups)
    grid = next(iter(grids)) if (every and len(grids) == 1) else None
    geometry = {
        "groups": groups,
        "hash_block_size": res.hash_block_size,
        "prefix_match_unit": pmu if pmu is not None and pmu != res.scheduler_block_size else None,
        "scheduler_block_size": res.scheduler_block_size,
        "retention_interval": retention,
        "max_num_batched_tokens": int(getattr(vc.scheduler_config, "max_num_scheduled_tokens", None) or vc.scheduler_config.max_num_batched_tokens),
        "prefill_checkpoint_grid": int(grid) if grid is not None else None,
        "shared_prefix_checkpoint": bool(getattr(vc.cache_config, "enable_mamba_shared_prefix_checkpoint", False)),
        "split_block_size": _split_block(res),
    }
    spec = None
    sc = vc.speculative_config
    if sc is not None:
        method = sc.method
        if method not in ("mtp", "eagle", "eagle3"):
            raise Unsupported(f"speculative method={method}: outside kvspec's model (mtp, eagle, eagle3)")
        spec = {"method": method, "num_speculative_tokens": int(sc.num_speculative_tokens)}
        for name in ("disable_eagle_block_drop", "disable_lookahead_block_hashes"):
            value = getattr(sc, name, None)
            if isinstance(value, bool) and value:
                spec[name] = True
    checkpoints = {}
    for g in res.kv_cache_config.kv_cache_groups:
        s = g.kv_cache_spec
        if type(s).__name__ == "MambaSpec" and getattr(s, "num_prefill_checkpoint_blocks", 0):
            checkpoints = {"internal_prefill_checkpoints": True, "prefill_checkpoint_alignment": getattr(s, "prefill_checkpoint_alignment", None)}
            break
    return geometry, spec, checkpoints


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
        "facts": {**res.facts, **checkpoints, "scheduler_block_size": res.scheduler_block_size, "hash_block_size": res.hash_block_size, "cache_hit_alignment_tokens": res.alignment_tokens},
        "assumptions": res.assumptions,
        "resolver": RESOLVER_VERSION,
    }


def needed_blocks(trace_tokens: list[int], block: int, k: int = 0) -> int:
    """Blocks per group a serial trace needs without eviction."""
    return 16 + sum(math.ceil((n + k + 2) / block) + k + 4 for n in trace_tokens)


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
        alignment = kv_cache_utils.resolve_cache_hit_alignment_tokens(kv_cache_config, vllm_config, scheduler_block_size, hash_block_size)
        for c in (*also, kv_cache_config):
            c.hash_block_size = hash_block_size
            c.cache_hit_alignment_tokens = alignment
    return scheduler_block_size, hash_block_size, alignment
