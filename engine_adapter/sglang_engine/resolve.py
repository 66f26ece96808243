"""A deployment resolved with SGLang's own argument code (SGLang 0.5.23):
``sglang serve``'s parser (``prepare_server_args``), its resolution
pipeline (``ServerArgs.resolve_once``: ``arg_groups/pipeline.py``, the
mamba hooks ``arg_groups/mamba_hook.py`` and ``model_hook.py
handle_mamba_radix_cache``) and its launch check
(``ServerArgs.check_server_args``, ``arg_groups/validation_hook.py:172-381``),
on the deployment's model config: the order ``Engine._launch_subprocesses``
runs them in (``entrypoints/engine.py:1153`` and ``:1165``), the path of the
HTTP server and of the Python ``Engine``. A deployment the launch check
refuses never serves (``--page-size 64 --chunked-prefill-size 1000``:
"chunked_prefill_size must be divisible by page_size", ``:241-246``), so
kvspec never runs one.

The platform: SGLang's hybrid cache is resolved as on a CUDA device
(``--device cuda`` with ``runtime_context.override_platform(is_cuda=True)``,
SGLang's own way to say what kind of machine it is), so ``auto`` resolves
as it does where SGLang serves; the cache itself then runs on CPU. What the
resolution reads:

* ``page_size``, ``chunked_prefill_size``, ``max_prefill_tokens``;
* ``mamba_radix_cache_strategy`` (``auto`` resolved), whether the extra
  buffer is on (``get_exec().mamba.enable_mamba_extra_buffer``);
* ``mamba_cache_chunk_size`` (max of the model's FLA chunk and the page:
  ``runtime_context.mamba_cache_chunk_size``), the checkpoint grid
  (``mamba_checkpoint_grid``: lcm of that and the page) and the decode
  track grid (``mamba_track_grid``: also the track interval);
* ``mamba_max_states_per_path`` and the speculative settings.

A deployment SGLang refuses (its parser's exit, an ``AssertionError`` or
``ValueError`` of a hook) is :class:`ground.errors.DeploymentRejected` with
SGLang's own message, one line.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from dataclasses import dataclass
from typing import Any

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.runtime_context import (
    get_exec,
    mamba_cache_chunk_size,
    mamba_checkpoint_grid,
    mamba_track_grid,
    override_platform,
)
from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler

from engine_adapter.models.served import model_config_dict, model_dir
from ground.errors import DeploymentRejected, Unsupported
from ground.printable import one_line
from reference.deployment import Deployment, parse_deployment

#: What the summary reads from the resolved ServerArgs (its own field names).
READ_FIELDS = (
    "page_size",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "mamba_radix_cache_strategy",
    "mamba_track_interval",
    "mamba_max_states_per_path",
    "max_total_tokens",
    "max_mamba_cache_size",
    "disable_radix_cache",
    "disable_overlap_schedule",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "attention_backend",
    "uses_mamba_radix_cache",
)


@dataclass(frozen=True)
class SglangResolution:
    """What SGLang resolved for a deployment: its own ServerArgs (global for
    the scheduler once :func:`resolve` returns) and the numbers kvspec reads."""

    server_args: Any
    page_size: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    strategy: str
    extra_buffer: bool
    chunk: int
    checkpoint_grid: int
    track_grid: int
    track_interval: int
    max_states_per_path: int
    speculative: str | None
    draft_tokens: int | None
    fields: dict
    context_length: int | None = None
    #: The model's Mamba kernel chunk (``schedule_batch.py:3142``: the
    #: config's ``mamba_chunk_size``, else 64): the grid of the snapshots
    #: the kernel can copy.
    state_chunk: int = 64
    #: SGLang's own ``ModelConfig`` of the deployment (``ScheduleBatch`` reads it).
    model_config: Any = None
    #: The token pool a deployment pins (``--max-total-tokens``), as SGLang
    #: sizes it: the smaller of the profiled pool and the cap
    #: (``kv_cache_configurator.py:3090-3106`` ``_apply_token_constraints``),
    #: floored to the page (``model_executor/pool_configurator.py:649-653``,
    #: the configurator of a Mamba hybrid without sliding windows,
    #: ``:1715-1725``). The profiled pool of a GPU is larger than any cap a
    #: case sets, so the cap is the pool. None: kvspec's pool (room for the
    #: whole trace).
    token_pool: int | None = None
    #: The Mamba state slots a deployment pins (``--max-mamba-cache-size``:
    #: taken as set, ``kv_cache_configurator.py:3303-3310``). None: kvspec's
    #: pool (room for every state the trace can leave).
    mamba_pool: int | None = None

    @property
    def pool_set_by_deployment(self) -> bool:
        """Did the deployment size a pool (the case is under pressure
        where a request's allocation evicts: ``fuzz.judge.oracles.before_pressure``)?"""
        return self.token_pool is not None or self.mamba_pool is not None

    def geometry(self) -> dict | None:
        """The resolution in kvspec's case geometry, for the engine-neutral
        promise (``reference``): a state resumable on the checkpoint grid and
        nowhere else. With the extra buffer SGLang tracks the last grid
        point of every extend, relative to its prefix
        (``schedule_batch.py _mamba_radix_cache_v2_req_prepare_for_extend``:
        ``prefix_len + (extend_len // grid) * grid``), and donates only
        tracked states, at chunk ends and at the end
        (``components/mamba.py _select_finished_checkpoint``); every prefix
        it resumes from is such a state and every chunk budget here is a
        multiple of the grid, so every state is on the absolute grid: the
        promise's blocks (full attention and Mamba) are the grid. Full
        attention is matched per page in SGLang; stating it per grid only
        lowers what the promise asks (no finding from a finer page). None
        under ``no_buffer``: a state is written only where a prefill ends
        (no buffer to track into), which no grid states; and under
        ``--mamba-max-states-per-path N``, whose documented job is to drop
        a path's interior states (``exec_.py``: "the shallowest eligible
        interior states beyond the cap are removed"): the user traded that
        reuse for memory, so the promise is not stated there either."""
        if not self.extra_buffer or self.chunked_prefill_size % self.checkpoint_grid or self.max_states_per_path != -1:
            return None
        grid = self.checkpoint_grid
        return {
            "groups": [{"kind": "full_attention", "block_size": grid}, {"kind": "mamba", "block_size": grid}],
            "hash_block_size": grid,
            "scheduler_block_size": grid,
            "prefix_match_unit": None,
            "retention_interval": 0,
            "max_num_batched_tokens": self.chunked_prefill_size,
        }

    def spec_algorithm(self):
        """SGLang's own ``SpeculativeAlgorithm`` of the resolved name
        (``spec_info.py:50 from_string``; NONE without speculation)."""
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return SpeculativeAlgorithm.from_string(self.speculative)

    def summary(self) -> dict:
        return {
            "engine_family": "sglang",
            "geometry": self.geometry(),
            "speculative": None,
            # the units a trace is drawn on (fuzz.driving.campaign.Campaign.resolver), whatever the strategy
            "facts": {
                "block": self.checkpoint_grid,
                "hash": self.page_size,
                "max_model_len": self.context_length,
                "max_num_seqs": 256,
                "track": self.track_grid,
                "chunk": self.chunked_prefill_size,
                "pool_set_by_deployment": self.pool_set_by_deployment,
            },
            "token_pool": self.token_pool,
            "mamba_pool": self.mamba_pool,
            "page_size": self.page_size,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "mamba_radix_cache_strategy": self.strategy,
            "extra_buffer": self.extra_buffer,
            "mamba_cache_chunk_size": self.chunk,
            "mamba_state_chunk_size": self.state_chunk,
            "checkpoint_grid": self.checkpoint_grid,
            "track_grid": self.track_grid,
            "mamba_track_interval": self.track_interval,
            "mamba_max_states_per_path": self.max_states_per_path,
            "speculative_algorithm": self.speculative,
            "speculative_num_draft_tokens": self.draft_tokens,
            "server_args": self.fields,
            "read_by": "sglang.srt.server_args.prepare_server_args + ServerArgs.resolve_once + check_server_args"
            " (platform: cuda)",
        }


def argv_of(dep: Deployment, model_path: str) -> list[str]:
    """The ``sglang serve`` command line kvspec resolves: the model, the
    CUDA device, then the deployment's allow-listed flags."""
    return ["--model-path", model_path, "--device", "cuda", *dep.sglang_args]


#: Resolutions a process keeps: SGLang's argument pipeline and config
#: loading cost more than a run of a case, and they are pure in the
#: deployment (its flags and model config). A refusal is not kept.
RESOLUTION_MEMO_SIZE = 64


def resolve(dep: Deployment) -> SglangResolution:
    """Resolve ``dep`` with SGLang's own code (once per deployment in a
    process); the result's ServerArgs is the scheduler's global one from
    here on."""
    if dep.engine != "sglang":
        raise Unsupported(f"deployment.engine={dep.engine!r}: this is SGLang's driver; allowed: sglang")
    res = _resolved(dep.key())
    set_global_server_args_for_scheduler(res.server_args)  # the last deployment resolved may have been another
    return res


@functools.lru_cache(maxsize=RESOLUTION_MEMO_SIZE)
def _resolved(key: str) -> SglangResolution:
    return _resolve_fresh(parse_deployment(json.loads(key)))


def _resolve_fresh(dep: Deployment) -> SglangResolution:
    path = str(model_dir(model_config_dict(dep)))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), override_platform(is_cuda=True):
            sa = prepare_server_args(argv_of(dep, path))
            sa.resolve_once()
            sa.check_server_args()
            set_global_server_args_for_scheduler(sa)
            resolved = sa.resolved_dict()
            chunk = mamba_cache_chunk_size()
            page = resolved["page_size"]
            grid, track = mamba_checkpoint_grid(page), mamba_track_grid(page)
            extra = bool(get_exec().mamba.enable_mamba_extra_buffer)
    except SystemExit:
        lines = [x for x in err.getvalue().splitlines() if x.strip()]
        raise DeploymentRejected(
            f"deployment.sglang_args: SGLang's parser refused them: {one_line(lines[-1] if lines else 'exit', 300)}"
        ) from None
    except (AssertionError, ValueError, TypeError) as e:
        raise DeploymentRejected(f"deployment: SGLang refused it: {one_line(e, 300) or type(e).__name__}") from None
    if not resolved.get("uses_mamba_radix_cache"):
        raise Unsupported(
            f"deployment.model={dep.model!r}: SGLang does not route it through the hybrid Mamba radix cache; allowed: a hybrid model"
        )
    fields = {k: resolved.get(k) for k in READ_FIELDS}
    model_config = ModelConfig.from_server_args(sa)
    token_pool, mamba_pool = pinned_pools(resolved, page, sa)
    return SglangResolution(
        server_args=sa,
        page_size=page,
        chunked_prefill_size=resolved["chunked_prefill_size"],
        max_prefill_tokens=resolved["max_prefill_tokens"],
        strategy=resolved["mamba_radix_cache_strategy"],
        extra_buffer=extra,
        chunk=chunk,
        checkpoint_grid=grid,
        track_grid=track,
        track_interval=resolved["mamba_track_interval"],
        max_states_per_path=resolved["mamba_max_states_per_path"],
        speculative=resolved["speculative_algorithm"],
        draft_tokens=resolved["speculative_num_draft_tokens"],
        fields=fields,
        context_length=resolved.get("context_length"),
        model_config=model_config,
        state_chunk=int(getattr(model_config.hf_text_config, "mamba_chunk_size", None) or 64),
        token_pool=token_pool,
        mamba_pool=mamba_pool,
    )


def pinned_pools(resolved: dict, page: int, sa) -> tuple[int | None, int | None]:
    """The token pool and the Mamba slots a deployment pins, as SGLang
    0.5.23 sizes them (:class:`SglangResolution` ``token_pool`` /
    ``mamba_pool``), or refused as SGLang refuses them: a token pool under
    one page holds nothing, and a Mamba pool of fewer slots than one
    request takes (``KVCacheConfigurator._calculate_mamba_ratio``,
    ``kv_cache_configurator.py:3062-3088``: 3, plus the extra buffer's
    tracking slots) serves no request (``resolve_max_num_reqs``,
    ``:3133-3160``, "state cache is too small to serve any requests")."""
    cap, slots = resolved.get("max_total_tokens"), resolved.get("max_mamba_cache_size")
    token_pool = None
    if cap is not None:
        token_pool = int(cap) // page * page
        if token_pool < page:
            raise DeploymentRejected(
                f"deployment.sglang_args: --max-total-tokens={cap}: under one page ({page}); allowed: at least the page size"
            )
    if slots is None:
        return token_pool, None
    with override_platform(is_cuda=True):
        set_global_server_args_for_scheduler(sa)
        ratio = KVCacheConfigurator._calculate_mamba_ratio(None)  # reads the globals only
    if int(slots) // ratio <= 0:
        raise DeploymentRejected(
            f"deployment.sglang_args: --max-mamba-cache-size={slots}: SGLang serves no request with it "
            f"({ratio} state slots per request); allowed: at least {ratio}"
        )
    return token_pool, int(slots)
