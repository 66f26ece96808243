"""SGLang 0.5.23's hybrid radix cache and prefill admission, driven
in-process on CPU (the entry point inside an SGLang environment).

What is SGLang's own, unchanged: the deployment's resolution
(:mod:`engine_adapter.sglang_engine.resolve`), the pools
(``HybridReqToTokenPool`` with its ``MambaPool``, ``HybridLinearKVPool``,
the token allocator of the page size), ``UnifiedRadixCache`` with the FULL
and MAMBA components and the tree core asked for (Python or the bundled
Rust one), and per request the scheduler's own steps
(``Scheduler._get_new_batch_prefill_raw`` and the prefill branch of
``process_batch_result_prefill``, in their order):

1. ``Req.init_next_round_input(tree_cache)``: the match, capped at N-1
   (``schedule_batch.py _compute_max_prefill_len``), with the Mamba
   copy-on-write staged;
2. ``PrefillAdder.add_one_req`` / ``add_chunked_req`` with the resolved
   ``chunked_prefill_size``: where a chunk is cut;
3. ``ScheduleBatch.init_new`` + ``prepare_for_extend``: KV allocation and,
   with the extra buffer, where the Mamba state is tracked
   (``_mamba_radix_cache_v2_req_prepare_for_extend`` sets
   ``mamba_last_track_seqlen``);
4. between chunks ``checkpoint_kv_cache`` (the scheduler's
   ``stash_chunked_request``); at the end ``release_kv_cache(checkpoint=True)``
   (the tree keeps what it can key).

Stood in: the model forward pass only. The model runner's deferred Mamba
clear and copy-on-write run through the pool's own methods
(``model_runner._maybe_execute_deferred_mamba_cow_and_clear``); the kernel's
state writes are a **fingerprint**: the working slot gets
``(tokens computed, crc of those tokens)`` at the extend's end, and a tracked
slot the same for its track length. So when a request resumes, the state
copied into its slot says which tokens it was computed over: the
observation's ``resumed_state`` (the engine-neutral stale rule, read off
the state itself).

Then, for a request that asks for more than one token, its decode steps
through SGLang's own ``prepare_for_decode`` and result processor
(:mod:`engine_adapter.sglang_engine.decode`: the decode-time tracking every
``--mamba-track-interval``, outputs cached as SGLang caches them).

With an EAGLE chain resolved (``--speculative-algorithm EAGLE|NEXTN``, topk
1), the tree keys bigrams as the scheduler builds it (``is_eagle``,
``kv_cache_builder.py:401``) and a request decodes by verify steps through
SGLang's own spec scheduling and result code, the verify stood in
(``decode.run_spec_decode``).

A concurrent trace's wave (requests sharing scheduler steps: several
requests per extend, one request's middle chunk beside others' prompts)
runs through the scheduler loop of :mod:`engine_adapter.sglang_engine.batching`.

Not driven (refused as ``Unsupported``, never guessed): other speculative
algorithms and draft trees (topk > 1), and speculation in a concurrent trace.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import sys
import time
import traceback
import zlib
from array import array
from pathlib import Path

from engine_adapter.sglang_engine.stubs import install as _install_stubs

_install_stubs()

import torch  # noqa: E402
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import PrefillAdder  # noqa: E402
from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from engine_adapter.inside import selftest as inside_selftest  # noqa: E402
from engine_adapter.interface import (  # noqa: E402
    Observation,
    ReleaseOfPackage,
    RequestObservation,
    as_case,
    family_deployment,
)
from engine_adapter.sglang_engine.batching import WaveRequest, serve_wave  # noqa: E402
from engine_adapter.sglang_engine.decode import finish_prefill, run_decode  # noqa: E402
from engine_adapter.sglang_engine.resolve import SglangResolution, resolve  # noqa: E402
from ground.errors import InvalidArgument, KvspecError, Unsupported  # noqa: E402
from ground.printable import one_line  # noqa: E402
from reference.case import Case, is_concurrent, prompt_tokens, waves  # noqa: E402

#: The tree cores ``UnifiedRadixCache`` can run (``tree_core_registry.py``).
TREE_CORES = ("python", "rust")
DEFAULT_TREE_CORE = "python"
#: The stand-in model: 4 layers, the last full attention (the wheel's own
#: test fixtures use the same shape, ``sglang/test/kits/unified_radix_cache``).
_LAYERS, _FULL = 4, (3,)
#: A fingerprint is two float32 numbers: exact up to 2**24.
_FP_MOD = 1 << 24
#: The most requests a case may have here (the Mamba pool holds a few slots each).
MAX_SGLANG_REQUESTS = 200


def _fingerprint(tokens) -> tuple[int, int]:
    """What a stood-in kernel writes for a state computed over ``tokens``."""
    return len(tokens) % _FP_MOD, zlib.crc32(array("q", tokens).tobytes()) % _FP_MOD


class _Cache:
    """One case's pools and radix cache, as ``ModelRunner`` and the
    scheduler build them for a hybrid model (CPU, stand-in layer shapes)."""

    def __init__(self, res: SglangResolution, lengths: list[int], tree_core: str) -> None:
        page = res.page_size
        mamba_ids = [i for i in range(_LAYERS) if i not in _FULL]
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("float32"):
            shape = Mamba2StateShape.create(
                tp_world_size=1,
                intermediate_size=64,
                n_groups=1,
                num_heads=2,
                head_dim=16,
                state_size=16,
                conv_kernel=4,
            )
            params = Mamba2CacheParams(shape=shape, layers=mamba_ids)
        total_tokens, requests = sum(lengths) + len(lengths), len(lengths)
        size = (total_tokens + 4 * page + 1024) // page * page + page
        # Room for every state the trace can leave in the tree and every
        # slot a request holds (its own, the ping-pong pair), so SGLang never
        # evicts: a hit lost to kvspec's pool size would be kvspec's finding.
        states = sum(n // max(1, res.chunked_prefill_size) + 6 for n in lengths) + 16
        # ... unless the deployment pins a pool (--max-total-tokens,
        # --max-mamba-cache-size, as SGLang sizes them: resolve.pinned_pools):
        # then it is that pool, and SGLang's own allocation evicts from the tree.
        if res.token_pool is not None:
            size = res.token_pool
        if res.mamba_pool is not None:
            states = res.mamba_pool
        self.req_pool = HybridReqToTokenPool(
            size=requests + 4,
            mamba_size=states,
            mamba_spec_state_size=requests + 4,
            # the row's headroom past the context, as SGLang sizes it for the
            # decode (and a verify's) over-allocation (kv_cache_configurator.py:1572)
            max_context_len=max(lengths, default=1) + 16 + get_req_to_token_extra_context_len(),
            device="cpu",
            enable_memory_saver=False,
            cache_params=params,
            mamba_layer_ids=mamba_ids,
            enable_mamba_extra_buffer=res.extra_buffer,
            speculative_num_draft_tokens=res.draft_tokens or 3,
        )
        kv = HybridLinearKVPool(
            size=size,
            dtype=torch.bfloat16,
            page_size=page,
            head_num=1,
            head_dim=8,
            full_attention_layer_ids=list(_FULL),
            device="cpu",
            enable_memory_saver=False,
            mamba_pool=self.req_pool.mamba_pool,
        )
        if page == 1:
            self.allocator = TokenToKVPoolAllocator(
                size=size, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
            )
        else:
            self.allocator = PagedTokenToKVPoolAllocator(
                size=size, page_size=page, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
            )
        self.tree = UnifiedRadixCache(
            params=CacheInitParams(
                req_to_token_pool=self.req_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=page,
                disable=False,
                tree_components=(ComponentType.FULL, ComponentType.MAMBA),
                enable_mamba_extra_buffer=res.extra_buffer,
                eviction_policy="lru",
                is_eagle=res.spec_algorithm().is_eagle(),  # bigram keys (kv_cache_builder.py:401)
                tree_core_backend=tree_core,
            )
        )
        self.tree_core = type(self.tree.tree_core).__name__
        #: What the radix cache's own eviction reported, call by call
        #: (``UnifiedRadixCache._evict``'s ``EvictResult``: full-attention
        #: tokens and Mamba states it freed; ``unified_radix_cache.py:690-760``,
        #: every ``evict`` / ``evict_for_alloc`` goes through it).
        self.evictions: list[tuple[int, int]] = []
        self.tree._evict = self._observed(self.tree._evict)

    def _observed(self, evict):
        def _evict(*args, **kwargs):
            result = evict(*args, **kwargs)
            if result.num_tokens_evicted or result.mamba_num_evicted:
                self.evictions.append((int(result.num_tokens_evicted), int(result.mamba_num_evicted)))
            return result

        return _evict

    def evicted_since(self, mark: int) -> list[list]:
        """``explain[i].evicted`` (engine-neutral: said only where it
        happened): one row per component the tree evicted from since
        ``mark`` (an index into :attr:`evictions`), ``[component, count]``:
        ``["full_attention", tokens]``, ``["mamba", states]``."""
        rows = self.evictions[mark:]
        tokens, states = sum(t for t, _ in rows), sum(m for _, m in rows)
        return [[k, n] for k, n in (("full_attention", tokens), ("mamba", states)) if n]

    # ---- the stood-in model runner
    def _slots(self, idx: torch.Tensor) -> torch.Tensor:
        return self.req_pool.translate_mamba_indices(idx)

    def deferred_cow_and_clear(self, batch) -> None:
        """The model runner's deferred Mamba clear and copy-on-write, by the
        pool's own methods (``_maybe_execute_deferred_mamba_cow_and_clear``)."""
        if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices):
            self.req_pool.mamba_pool.clear_slots(self._slots(batch.mamba_clear_indices))
        if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices):
            self.req_pool.copy_mamba_state(
                self._slots(batch.mamba_cow_src_indices), self._slots(batch.mamba_cow_dst_indices)
            )

    def _temporal(self) -> torch.Tensor:
        return self.req_pool.mamba_pool.mamba_cache.temporal

    def write(self, slot: torch.Tensor, tokens) -> None:
        n, crc = _fingerprint(tokens)
        t = self._temporal()
        phys = int(self._slots(slot.reshape(1))[0])
        t[:, phys].zero_()
        flat = t[0, phys].view(-1)
        flat[0], flat[1] = float(n), float(crc)

    def read(self, slot: torch.Tensor) -> tuple[int, int]:
        phys = int(self._slots(slot.reshape(1))[0])
        flat = self._temporal()[0, phys].view(-1)
        return int(flat[0].item()), int(flat[1].item())


class SglangDriver(ReleaseOfPackage):
    """The SGLang family's driver (``engine_adapter.interface.FamilyDriver``)."""

    family = "sglang"

    def resolve(self, case) -> dict:
        case = _as_case(case)
        dep = _deployment(case)
        return {"engine": self.name, "deployment": dep.as_dict(), **resolve(dep).summary()}

    def run(self, case, options: dict | None = None) -> Observation:
        options = options or {}
        t0 = time.perf_counter()
        case = _as_case(case)
        tree_core = options.get("tree_core", DEFAULT_TREE_CORE)
        if tree_core not in TREE_CORES:
            raise InvalidArgument(f"options.tree_core={tree_core!r}: allowed: {', '.join(TREE_CORES)}")
        dep = _deployment(case)  # a case of another family is refused first (it has no sglang_args)
        _check_case(case)
        res = resolve(dep)
        _check_resolution(res)
        if res.speculative and is_concurrent(case):
            raise Unsupported(
                "trace: a concurrent trace (arrival) with speculative decoding; allowed on SGLang: serial requests "
                "under speculation, or a concurrent trace without it"
            )
        prompts = [prompt_tokens(r) for r in case.trace]
        cache = _Cache(res, [len(p) + r.max_tokens for p, r in zip(prompts, case.trace)], tree_core)
        self._model_config = res.model_config  # SGLang's own, from the deployment's config.json
        self._state_chunk = res.state_chunk
        t1 = time.perf_counter()
        explain: list[RequestObservation] = []
        error = None
        concurrent, clock = is_concurrent(case), 0
        for wave in waves(case):
            mark = len(cache.evictions)
            try:
                if len(wave) == 1:
                    i = wave[0]
                    served = [self._serve(cache, res, i, prompts[i], case.trace[i].max_tokens)]
                else:
                    served = self._serve_wave(cache, res, case, wave, prompts)
                if concurrent:  # one scheduler clock over the trace, for the oracles that judge by steps
                    clock = _on_clock(served, clock)
                evicted = cache.evicted_since(mark)
                if evicted:  # a wave's evictions are its first request's (the judge reads the wave)
                    served[0]["evicted"] = evicted
                explain.extend(served)
            except KvspecError:
                raise
            except Exception as e:  # SGLang's own failure when it raised in SGLang's code; else kvspec's
                error = {
                    "kind": _failure_kind(e),
                    "phase": "step",
                    "request": wave[0] if len(wave) == 1 else wave[len(explain) - wave[0]],
                    "type": type(e).__name__,
                    "message": one_line(e, 500) or type(e).__name__,
                    "traceback": traceback.format_exc()[-4000:],
                }
                break
        out: Observation = {
            "engine": self.name,
            "hits": [e["hit"] for e in explain],
            "queries": [e["query"] for e in explain],
            "knobs": None,
            "explain": explain,
            "resolution": res.summary(),
            "timing": {"setup_s": round(t1 - t0, 4), "run_s": round(time.perf_counter() - t1, 4)},
            "harness": {"tree_core": tree_core, "tree_core_class": cache.tree_core},
        }
        if error:
            out["error"] = error
        return out

    def _serve_wave(self, cache: _Cache, res: SglangResolution, case: Case, wave: list[int], prompts) -> list:
        """A wave of requests sharing the scheduler
        (:mod:`engine_adapter.sglang_engine.batching`), each observed as
        :meth:`_serve` observes one."""
        arrivals = [WaveRequest(i, prompts[i], case.trace[i].max_tokens, case.trace[i].arrival or 0) for i in wave]
        seen, steps = serve_wave(
            cache,
            res,
            self._model_config,
            arrivals,
            lambda a: _new_req(a.index, a.tokens, a.max_tokens),
            lambda batch, req, row: _tracked_content(batch, req, self._state_chunk, row),
        )
        out = []
        for a, s in zip(arrivals, seen):
            hit = int(s.hit or 0)
            want = _fingerprint(a.tokens[:hit]) if hit else (0, 0)
            out.append(
                {
                    "request": a.index,
                    "prompt_tokens": len(a.tokens),
                    "hit": hit,
                    "query": len(a.tokens),
                    "scheduler_hit": hit,
                    "junction": None,
                    "branching": s.branching,
                    "chunk_ends": s.chunk_ends,
                    "written": sorted(s.written),
                    "tracked": s.tracked,
                    "resumed_state": {"tokens": s.resumed[0], "same_tokens": s.resumed == want} if hit else None,
                    "decode_steps": s.decode_steps,
                    "computed_tokens": len(a.tokens) + a.max_tokens - 1,
                    "lookups": 1,
                    # the scheduler steps from the first that ran it to the one it finished in
                    "steps": s.last_step - s.first_step + 1,
                    "first_step": s.first_step,
                    "written_steps": [list(w) for w in s.written_steps],
                    "wave_steps": steps,
                }
            )
        return out

    def _serve(
        self, cache: _Cache, res: SglangResolution, i: int, tokens: list[int], max_tokens: int = 1
    ) -> RequestObservation:
        """One request through the scheduler's prefill path, then its decode
        steps (:mod:`engine_adapter.sglang_engine.decode`), alone."""
        req = _new_req(i, tokens, max_tokens)
        spec = res.spec_algorithm()
        running = ScheduleBatch.init_new(
            [], cache.req_pool, cache.allocator, cache.tree, self._model_config, False, spec
        )
        chunked = None
        hit = branching = None
        resumed = None
        chunk_ends: list[int] = []
        decode_steps: list[list[int]] = []
        written: list[int] = []
        tracked: list[int] = []
        for _round in range(len(tokens) + 2):
            if chunked is not None:
                checkpoint_kv_cache(chunked, cache.tree)
            adder = PrefillAdder(
                res.page_size,
                cache.tree,
                cache.allocator,
                running,
                1.0,
                res.max_prefill_tokens,
                res.chunked_prefill_size,
            )
            if chunked is not None:
                chunked.init_next_round_input()
                chunked = adder.add_chunked_req(chunked)
            else:
                req.init_next_round_input(cache.tree)
                hit, branching = req.prefix_len, req.mamba_branching_seqlen
                adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                if req not in adder.can_run_list:
                    raise RuntimeError(
                        f"PrefillAdder did not admit request {i} ({len(tokens)} tokens) into an empty batch"
                    )
            if adder.new_chunked_req is not None:
                chunked = adder.new_chunked_req
            if chunked is not None:
                chunked.inflight_middle_chunks += 1
            batch = ScheduleBatch.init_new(
                adder.can_run_list,
                cache.req_pool,
                cache.allocator,
                cache.tree,
                self._model_config,
                False,
                spec,
                chunked_req=chunked,
            )
            batch.prepare_for_extend()
            cache.deferred_cow_and_clear(batch)
            if resumed is None:
                resumed = cache.read(req.kv.mamba_pool_idx) if hit else (0, 0)
            end = req.extend_end
            chunk_ends.append(end)
            cache.write(req.kv.mamba_pool_idx, tokens[:end])
            written.append(end)
            if (
                res.extra_buffer
                and batch.mamba_prefill_track_mask_cpu is not None
                and batch.mamba_prefill_track_mask_cpu[0]
            ):
                at = req.kv.mamba_last_track_seqlen  # the length the tree keys the state at
                computed = _tracked_content(
                    batch, req, self._state_chunk
                )  # the tokens the kernel's copy was computed over
                cache.write(batch.mamba_track_indices[0], tokens[:computed])
                tracked.append(at)
                if computed not in written:
                    written.append(computed)
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1
                continue
            finish_prefill(req, cache.tree)
            decode_steps, decode_tracked = run_decode(
                cache, batch, req, max_tokens, res.draft_tokens if res.speculative else None
            )
            tracked.extend(decode_tracked)
            if res.speculative:  # a verify's tracked snapshot lies inside its step: a state written there too
                written.extend(t for t in decode_tracked if t not in written)
            break
        else:
            raise RuntimeError(f"request {i}: prefill did not finish within {len(tokens) + 2} rounds")
        want = _fingerprint(tokens[:hit]) if hit else (0, 0)
        return {
            "request": i,
            "prompt_tokens": len(tokens),
            "hit": int(hit),
            "query": len(tokens),
            "scheduler_hit": int(hit),
            "junction": None,
            "branching": branching,
            "chunk_ends": chunk_ends,
            "written": sorted(written),
            "tracked": tracked,
            "resumed_state": {"tokens": resumed[0], "same_tokens": resumed == want} if hit else None,
            "decode_steps": decode_steps,
            # a plain decode computes all but its last output; a verify step
            # computes every token it commits, so the last one ends past them
            "computed_tokens": (
                decode_steps[-1][0] + decode_steps[-1][2]
                if res.speculative and decode_steps
                else len(tokens) + max_tokens - 1
            ),
            "lookups": 1,
            "steps": len(chunk_ends),
        }


def _on_clock(served: list[dict], clock: int) -> int:
    """Put a wave's (or a request's alone) observations on the trace's
    scheduler clock starting at ``clock``; returns the clock after it. A
    request served alone ran its chunks, then its decode steps, one step
    each; its writes are read as done by its first step (every later
    request starts after it finished)."""
    span = 0
    for e in served:
        if "first_step" not in e:
            e["steps"] = len(e["chunk_ends"]) + len(e["decode_steps"])
            e["first_step"] = 0
            e["written_steps"] = [[p, 0] for p in e["written"]]
            e["wave_steps"] = e["steps"]
        e["first_step"] += clock
        e["written_steps"] = [[p, s + clock] for p, s in e["written_steps"]]
        span = max(span, int(e["wave_steps"]))
    return clock + span


def _new_req(i: int, tokens: list[int], max_tokens: int) -> Req:
    """Request ``i`` as the tokenizer manager hands it to the scheduler
    (greedy, ``max_tokens`` new tokens; no stop strings: no tokenizer)."""
    params = SamplingParams(temperature=0, max_new_tokens=max_tokens)
    params.normalize(None)
    return Req(rid=f"kvspec-{i}", origin_input_text="", origin_input_ids=array("q", tokens), sampling_params=params)


def _tracked_content(batch, req, state_chunk: int, row: int = 0) -> int:
    """The tokens the state the kernel copies into the track slot was
    computed over, by SGLang's own plan of that copy (0.5.23
    ``layers/attention/mamba/prefill_track_metadata.py:23
    build_prefill_track_plan``, read by ``hybrid_linear_attn_backend.py:537
    _init_track_ssm_indices_from_cpu``): with ``L = mamba_track_seqlen -
    prefix`` (``schedule_batch.py:3002``, the seqlen the scheduler passes,
    not the one the tree keys), the extend's final state when ``L`` is a
    multiple of the model's chunk, else the snapshot ``L // chunk`` chunks
    past the prefix. The tree keys it at ``mamba_last_track_seqlen``
    (``schedule_batch.py:3232``; ``components/mamba.py:604``) floored to the
    page (``unified_radix_cache.py:1232``): where the two differ, a resumed
    state says so (``resumed_state.same_tokens``)."""
    from sglang.srt.layers.attention.mamba.prefill_track_metadata import build_prefill_track_plan

    prefix, end = req.prefix_len, req.extend_end
    plan = build_prefill_track_plan(
        [True], [int(batch.mamba_track_seqlens_cpu[row])], [end - prefix], [prefix], state_chunk, mamba2=False
    )
    return end if plan.final_rows else prefix + plan.chunk_indices[0] * state_chunk


def _failure_kind(e: BaseException) -> str:
    """``sglang`` when the innermost frame that raised is SGLang's code (its
    own failure, judged as engine behaviour), ``internal`` when it is
    kvspec's (an adapter bug, a harness error)."""
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return "sglang" if last and _SGLANG_DIR in last else "internal"


_SGLANG_DIR = str(Path(importlib.import_module("sglang").__file__).parent)


_as_case = as_case
_deployment = functools.partial(family_deployment, family="sglang")


def _check_case(case: Case) -> None:
    """What this driver does not drive yet is refused, never guessed: more
    than :data:`MAX_SGLANG_REQUESTS` requests."""
    if len(case.trace) > MAX_SGLANG_REQUESTS:
        raise Unsupported(f"trace: {len(case.trace)} requests; allowed on SGLang: at most {MAX_SGLANG_REQUESTS}")


def _check_resolution(res: SglangResolution) -> None:
    """Speculative decoding is driven where SGLang resolves it to an EAGLE
    chain (``SpeculativeAlgorithm.is_eagle``: EAGLE, EAGLE3, NEXTN/MTP
    aliases; ``--speculative-eagle-topk 1``) over a Mamba buffer: the verify
    steps of :func:`engine_adapter.sglang_engine.decode.run_spec_decode`.
    Any other algorithm (its own worker and draft input) or a draft tree
    (topk > 1) is refused in one line with what SGLang resolved."""
    if not res.speculative:
        return
    topk = res.fields.get("speculative_eagle_topk") or 1
    if not res.spec_algorithm().is_eagle() or topk != 1:
        raise Unsupported(
            f"deployment: speculative decoding ({res.speculative}, topk {topk}, {res.draft_tokens} draft tokens, "
            f"{res.strategy} as SGLang resolved it) is not driven on SGLang; allowed: an EAGLE chain (topk 1)"
        )


@functools.cache
def get_driver() -> SglangDriver:
    """The one driver of this process (SGLang imported once)."""
    return SglangDriver()


def selftest_case() -> dict:
    """Three identical 3,300-token requests on Qwen3-Next with the extra
    buffer, page 64, chunks of 2,048: the whole path (resolution, both
    chunk kinds, tracking, copy-on-write) in a few seconds."""
    return inside_selftest.case_beside(__file__)


#: The SGLang modules an import-only self-test imports.
IMPORT_CHECK = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.schedule_policy",
)


def selftest(expect_version: str | None, out, *, import_only: bool = False) -> int:
    """The SGLang family's self-test: import the stack and, unless
    ``import_only``, run :func:`selftest_case` on both tree cores (the
    second request must hit, both cores the same); a JSON line on ``out``,
    exit 1 with one line on stderr when it fails."""
    loaded = inside_selftest.load(get_driver, "SGLang", expect_version)
    if loaded is None:
        return 1
    driver, import_s = loaded
    summary = {
        "vllm_version": driver.version,
        "engine": driver.name,
        "torch_version": torch.__version__,
        "import_s": round(import_s, 2),
    }
    if import_only:
        return inside_selftest.import_only(out, IMPORT_CHECK, summary)
    hits = {}
    for core in TREE_CORES:
        result = driver.run(selftest_case(), {"tree_core": core})
        if result.get("error"):
            print(f"selftest: SGLang raised ({core} tree core): {result['error']['message']}", file=sys.stderr)
            return 1
        hits[core] = result["hits"]
    if hits["python"] != hits["rust"] or not (hits["python"][0] == 0 and hits["python"][1] > 0):
        print(f"selftest: implausible hits {hits} (the resend must hit; both tree cores the same)", file=sys.stderr)
        return 1
    out.write(json.dumps({**summary, "hits": hits["python"], "tree_cores": list(TREE_CORES)}) + "\n")
    out.flush()
    return 0
