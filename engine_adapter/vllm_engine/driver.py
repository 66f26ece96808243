"""Drive the real vLLM scheduler over a case, with a simulated model.

The engine adapter's entry point inside an engine environment (the other
modules of the run path: ``setup`` builds what ``EngineCore`` builds,
``steploop`` serves each request, ``observe`` records what vLLM did;
``resolve`` turns a deployment into vLLM's own config). Nothing in vLLM is
edited: the adapter reads vLLM objects and wraps a few *instance* methods to
record what they were called with and returned. It observes; it does not
judge.

What is observed, per request (``explain``):

* ``hit`` / ``query``: the sum of ``prefix_cache_stats.hits`` / ``.queries``
  over every step's ``SchedulerStats`` (what ``vllm:prefix_cache_hits_total``
  / ``vllm:prefix_cache_queries_total`` grow by);
* ``scheduler_hit``, ``junction`` (``shared_prefix_boundary``): what
  ``KVCacheManager.get_computed_blocks`` returned at admission;
  ``attention_blocks``: [block size, blocks it returned] per full-attention
  group at that first lookup;
* ``boundaries``: the ``replay_boundaries`` the coordinator handed the Mamba
  managers' ``cache_blocks`` (0.30.0+; ``null`` before);
* ``chunk_ends``: ``num_computed_tokens`` after each prefill step;
* ``decode_steps``: [tokens computed before, tokens asked for (the sampled
  token and the drafts), tokens scheduled] of each step after the prefill
  (only where ``max_tokens`` > 1);
* ``computed_tokens``: ``num_computed_tokens`` once it finished (its
  prompt and every output token but the last; the decode steps' states lie
  at each ``decode_steps`` start past the prompt and here);
* ``written``: the positions this request's prefill wrote a Mamba state at
  in every Mamba group: its chunk ends and the internal prefill checkpoints
  vLLM's worker-side builder places (``engine_adapter.vllm_engine.writes``); ``null``
  where this vLLM's checkpoint writes cannot be observed;
* ``cache_blocks``: ``num_tokens`` of each Mamba ``cache_blocks`` call;
* ``retained_mamba_blocks``: per Mamba block size M, the indices i of this
  request's prompt states (the state after ``(i+1)*M`` tokens, within the
  prompt) that the block pool holds for every Mamba group once the request
  has finished;
* ``retained_output_states``: the token counts past the prompt (states
  inside the request's output) at which any Mamba group's state is held
  once it has finished;
* ``block_table``: [tokens computed before the step, unretired, freed] for
  each step after whose scheduling the request's Mamba block tables held
  blocks below the state the step starts from that carry no hash
  (unretired), or blocks whose reference count is below 1 (freed)
  (``observe.BlockTable``; align mode); ``[]`` where none;
* ``leaked_blocks``: the block references (any KV cache group) left once
  the request has finished and the scheduler holds no request, deferred
  frees not counted (``observe.BlockTable.leaked``); 0 where none;
* ``evicted``, ``preempted_steps`` / ``resumed_steps`` (only where it
  happened: a pool the deployment pins, ``--num-gpu-blocks-override``):
  what this request's allocations evicted from the prefix cache, and the
  steps that preempted it and scheduled it again
  (``engine_adapter.vllm_engine.pressure``).

A deployment case runs on what vLLM built for it; its result carries the
``resolution`` (geometry, facts, assumptions). A hand-geometry case runs on
kvspec's own groups.

Every result also says what ran it: ``vllm_files_sha256``, a digest of the
vLLM files under test (:func:`vllm_files_sha256`, computed once per
process) and ``harness.platform``, the platform this process runs vLLM under
(the engine adds ``harness.mode``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from engine_adapter.vllm_engine import platform as _platform
from ground.files import hash_files
from ground.home import contain_this_process

contain_this_process()
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
_platform.install()

import torch  # noqa: E402
import vllm  # noqa: E402

from engine_adapter.inside import selftest as inside_selftest  # noqa: E402
from engine_adapter.vllm_engine import modelinfo  # noqa: E402
from engine_adapter.vllm_engine.failure import VllmFailure, vllm_outcome  # noqa: E402
from engine_adapter.vllm_engine.forward import StateSlots  # noqa: E402
from engine_adapter.vllm_engine.observe import SAMPLED_TOKEN, BlockTable, Recorder, RetainedScan, read_knobs  # noqa: E402
from engine_adapter.vllm_engine.pressure import Evictions  # noqa: E402
from engine_adapter.vllm_engine.setup import build_deployment, build_hand, detect_capabilities  # noqa: E402
from engine_adapter.vllm_engine.steploop import Arrival, serve, serve_wave  # noqa: E402
from engine_adapter.vllm_engine.writes import checkpoint_writer, written  # noqa: E402
from reference.case import Case, case_to_dict, is_concurrent, parse_case, prompt_tokens, waves  # noqa: E402

VLLM_VERSION = vllm.__version__
#: Version of the result layout (``hits``, ``queries``, ``knobs``, ``explain``).
RESULT_SCHEMA = 1
__all__ = ["SAMPLED_TOKEN", "VLLM_VERSION", "VllmDriver", "VllmFailure", "get_driver", "selftest_case"]


#: The vLLM files whose behaviour kvspec tests: the scheduler and KV cache
#: manager, the config classes, and the platform interface (block sizes).
VLLM_FILES_UNDER_TEST = ("v1/core/**/*.py", "config/*.py", "platforms/interface.py")
_FILES_SHA256: str | None = None


def vllm_files_sha256(root: str | os.PathLike | None = None) -> str:
    """sha256 over the vLLM files under test (:data:`VLLM_FILES_UNDER_TEST`,
    relative to the ``vllm`` package folder ``root``, default the imported
    one): each file's relative path, a NUL, its bytes and a NUL, in path
    order. Computed once per process for the imported vLLM."""
    global _FILES_SHA256
    if root is None and _FILES_SHA256 is not None:
        return _FILES_SHA256
    base = Path(root if root is not None else os.path.dirname(vllm.__file__))
    h = hashlib.sha256()
    hash_files(h, base, VLLM_FILES_UNDER_TEST)
    digest = h.hexdigest()
    if root is None:
        _FILES_SHA256 = digest
    return digest


class VllmDriver:
    """Runs cases against the vLLM importable in this interpreter."""

    family = "vllm"

    def __init__(self) -> None:
        self.version = VLLM_VERSION
        self.caps = detect_capabilities()
        self.platform = _platform.process_platform()

    def build(self, case: Case, options: dict) -> dict:
        """What ``EngineCore`` builds for the case (deployment or hand)."""
        if case.deployment is not None:
            return build_deployment(self.caps, case, options)
        # A hand geometry is built under the default GPU's answers, whatever
        # deployment this process resolved before (a long-lived worker runs
        # case after case; each must build as in a fresh process).
        _platform.set_device(None)
        return build_hand(self.caps, case, options)

    def resolve(self, case_or_dict: Case | dict) -> dict:
        """The resolution of a deployment case (geometry, facts, assumptions)."""
        from engine_adapter.vllm_engine.resolve import resolve, summary

        case = case_or_dict if isinstance(case_or_dict, Case) else parse_case(case_or_dict)
        if case.deployment is None:
            from ground.errors import Unsupported

            raise Unsupported(
                "case.geometry: a hand geometry; allowed: a case with a deployment (resolve turns model + flags into a geometry)"
            )
        try:
            return summary(resolve(case.deployment))
        except VllmFailure as f:  # a crash has no geometry; to a resolve caller it is a deployment vLLM cannot build
            from ground.errors import DeploymentCrashes

            raise DeploymentCrashes(
                f"deployment={case.deployment.describe()!r}: vLLM crashes resolving it ({f.phase}): {f}"
            ) from None

    def run(self, case_or_dict: Case | dict, options: dict | None = None) -> dict:
        """Run a case. Returns the result dict; vLLM exceptions come back as
        ``{"error": {...}}`` (with the requests that finished before it);
        kvspec's own errors (InvalidArgument/Unsupported) are raised.

        ``options``: ``eagle_groups`` (hand geometries: ``auto``, ``all``,
        ``draft``); ``retained`` (default true): ``false`` skips the
        block-pool scan after each request, for a campaign whose oracles
        read only hits, queries and knobs; ``retained_mamba_blocks``,
        ``retained_mamba_tokens`` and ``retained_output_states`` are then
        null."""
        options = dict(options or {})
        case = case_or_dict if isinstance(case_or_dict, Case) else parse_case(case_or_dict)
        t0, c0 = time.perf_counter(), time.process_time()
        result: dict[str, Any] = {
            "engine": f"vllm=={self.version}",
            "hits": [],
            "queries": [],
            "knobs": None,
            "explain": [],
            "vllm_files_sha256": vllm_files_sha256(),
            "harness": {"platform": self.platform},
        }
        setup = setup_cpu = 0.0
        try:
            built = self.build(case, options)
            if built.get("resolution") is not None:
                result["resolution"] = built["resolution"]
            result["knobs"] = read_knobs(self.version, built)
            setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
            self._trace(case, built, result, options)
        except VllmFailure as f:
            result["error"] = f.as_dict()
            if not setup:
                setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
        # wall and CPU seconds (this process's), of the setup and in all
        result["timing"] = {
            "setup_s": round(setup, 6),
            "total_s": round(time.perf_counter() - t0, 6),
            "setup_cpu_s": round(setup_cpu, 6),
            "total_cpu_s": round(time.process_time() - c0, 6),
        }
        return result

    def _trace(self, case: Case, built: dict, result: dict, options: dict) -> None:
        s = built["scheduler"]
        rec = Recorder()
        scan = None
        try:
            rec.wrap(s, built["mamba_group_ids"])
            table = BlockTable(s, built["mamba_group_ids"])
            if options.get("retained", True):
                scan = RetainedScan(s, built)
            slots = StateSlots(s, built) if options.get("states", True) else None
            slots = slots if slots is not None and slots.active else None
            evictions = Evictions(s, int(built["hash_block_size"]))
        except Exception as e:  # kvspec's observers reading vLLM's managers
            if vllm_outcome(e, "run") is None:
                raise
            raise VllmFailure("setup", e) from None
        writer = checkpoint_writer(built)  # kvspec's own code: an error here is the harness's
        concurrent = is_concurrent(case)
        clock = 0  # scheduler steps run so far (a concurrent trace's explain says when)

        def explain(i: int, served, at: int | None, wave_info: dict | None) -> None:
            """``_explain`` with this run's case and observers."""
            self._explain(case, i, served, rec, scan, table, writer, result, at, wave_info, slots, evictions)

        for wave in waves(case):
            if len(wave) == 1:
                i = wave[0]
                creq = case.trace[i]
                served = serve(s, i, prompt_tokens(creq), creq.max_tokens, built["hasher"], watch=table, slots=slots)
                explain(i, served, clock if concurrent else None, None)
                clock += served.steps
                continue
            arrivals = [
                Arrival(i, prompt_tokens(case.trace[i]), case.trace[i].max_tokens, case.trace[i].arrival or 0)
                for i in wave
            ]
            admitted_lookups: dict[str, int] = {}
            wave_served, totals = serve_wave(
                s,
                arrivals,
                built["hasher"],
                watch=table,
                admitted=lambda rid: admitted_lookups.__setitem__(rid, len(rec.lookups.get(rid, ()))),
                slots=slots,
            )
            for i, served in zip(wave, wave_served):
                explain(
                    i,
                    served,
                    clock,
                    {"wave": wave, "totals": totals, "lookup": admitted_lookups.get(f"req-{i}", 1) - 1},
                )
            clock += totals["steps"]

    def _explain(
        self,
        case: Case,
        i: int,
        served,
        rec,
        scan,
        table,
        writer,
        result: dict,
        clock: int | None,
        wave: dict | None,
        slots=None,
        evictions=None,
    ) -> None:
        """Append request ``i``'s observation to ``result``. ``clock``: the
        scheduler steps run before its wave (a concurrent trace; None for a
        serial one); ``wave``: its wave's indices, summed stats and which of
        its lookups admitted it (None when it ran alone)."""
        tokens = served.request.prompt_token_ids
        rid = f"req-{i}"
        lookups = rec.lookups.get(rid, [])
        if wave is not None and lookups:  # the lookup that admitted it (an earlier one was deferred)
            lookups = lookups[max(0, min(wave["lookup"], len(lookups) - 1)) :]
        cache_blocks, boundaries = rec.cache_blocks_of(rid)
        by_size = tokens_held = by_group = after = None
        if scan is not None:
            prompt_hashes = len(tokens) // scan.hbs
            by_size, tokens_held, by_group = scan.retained(served.request.block_hashes[:prompt_hashes])
            after = scan.held_after(served.request.block_hashes, prompt_hashes)
        explain = {
            "request": i,
            "prompt_tokens": len(tokens),
            "hit": served.hits,
            "query": served.queries,
            "scheduler_hit": lookups[0][0] if lookups else None,
            "junction": (lookups[0][1] or 0) if lookups else None,
            "shared_prefix_boundary": lookups[0][1] if lookups else None,
            "lookups": len(lookups),
            "attention_blocks": rec.attention_blocks.get(rid),
            "boundaries": boundaries,
            "chunk_ends": served.chunk_ends,
            "decode_steps": [list(d) for d in served.decode_steps],
            "computed_tokens": served.request.num_computed_tokens,
            "written": None if writer is None else written(served, writer),
            "cache_blocks": cache_blocks,
            "retained_mamba_blocks": by_size,
            "retained_mamba_tokens": tokens_held,
            "retained_output_states": after,
            "block_table": [list(u) for u in served.block_table],
            "leaked_blocks": table.leaked() if wave is None or i == wave["wave"][-1] else 0,
            "steps": served.steps,
        }
        if clock is not None:  # a concurrent trace: when each request ran and each state was written
            explain["first_step"] = None if served.first_step is None else clock + served.first_step
            at = [clock + k for k in served.prefill_at]
            explain["written_steps"] = (
                None
                if explain["written"] is None
                else [[p, _step_of(p, served.prefill_steps, at)] for p in explain["written"]]
            )
        if wave is not None:
            explain["wave"] = wave["wave"]
            explain["wave_stats"] = wave["totals"]
        # a cache under pressure (engine_adapter.vllm_engine.pressure): said only where it happened
        evicted = evictions.of(rid) if evictions is not None else []
        if evicted:
            explain["evicted"] = evicted
        if served.preempted:
            explain["preempted_steps"] = [clock + k if clock is not None else k for k in served.preempted]
            explain["resumed_steps"] = [clock + k if clock is not None else k for k in served.resumed]
        if served.external_hits:  # of ``hit``, what a KV connector loaded
            explain["external_hit"] = served.external_hits
        if served.preempted_hits or served.preempted_queries:
            explain["preempted_hits"] = served.preempted_hits
            explain["preempted_queries"] = served.preempted_queries
        if by_group is not None:
            explain["retained_mamba_by_group"] = by_group
        resumed = slots.resumed_state(rid) if slots is not None else None
        if (
            resumed is not None
        ):  # what the stood-in forward pass read where the request resumed (engine_adapter.vllm_engine.forward)
            explain["resumed_state"] = resumed
        result["hits"].append(served.hits)
        result["queries"].append(served.queries)
        result["explain"].append(explain)


def _step_of(pos: int, prefill_steps: list[tuple[int, int]], at: list[int]) -> int | None:
    """The step whose prefill computed the state at ``pos``: the one whose
    query ``(seq - query, seq]`` holds it."""
    for (seq, query), step in zip(prefill_steps, at):
        if seq - query < pos <= seq:
            return step
    return None


def selftest_case() -> dict:
    """Three identical 3300-token requests, block 16, MTP K=2: exercises the
    MTP config (two model classes inspected) and the whole loop in well under
    a second. Every version hits on the third request (0.29.0 misses the
    second: the #53504 bug)."""
    return inside_selftest.case_beside(__file__)


#: The modules an import-only self-test imports (``engine_adapter.inside.worker --selftest --import-only``): where the scheduler, the
#: KV cache managers and the block-size resolution live.
IMPORT_CHECK = (
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.engine.core",
)


def selftest(expect_version: str | None, out, *, import_only: bool = False) -> int:
    """The vLLM family's self-test (``python -m engine_adapter.inside.worker
    --selftest``, before an install is marked ready): import the stack
    (and, unless ``import_only``, run one tiny MTP case, whose second resend
    must hit); a JSON summary on ``out``, exit 1 with one line on stderr
    when it fails."""
    loaded = inside_selftest.load(get_driver, "vLLM", expect_version)
    if loaded is None:
        return 1
    driver, import_s = loaded
    if import_only:
        return inside_selftest.import_only(
            out,
            IMPORT_CHECK,
            {"vllm_version": driver.version, "torch_version": torch.__version__, "import_s": round(import_s, 2)},
        )
    result = driver.run(selftest_case())
    if result.get("error"):
        print(f"selftest: vLLM raised: {result['error']['message']}", file=sys.stderr)
        return 1
    hits = result["hits"]
    if not (hits[0] == 0 and hits[2] > 0):
        print(f"selftest: implausible hits {hits} (the second resend must hit)", file=sys.stderr)
        return 1
    model_info = modelinfo.warm()  # vLLM's model-info cache, before anything resolves a deployment
    out.write(
        json.dumps(
            {
                "vllm_version": driver.version,
                "torch_version": torch.__version__,
                "hits": hits,
                "import_s": round(import_s, 2),
                "run_s": result["timing"]["total_s"],
                "model_info": model_info,
            }
        )
        + "\n"
    )
    out.flush()
    return 0


_DRIVER: VllmDriver | None = None


def get_driver() -> VllmDriver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = VllmDriver()
    return _DRIVER


if __name__ == "__main__":  # python -m engine_adapter.vllm_engine.driver CASE.json
    from reference.case import load_case

    print(json.dumps(get_driver().run(case_to_dict(load_case(sys.argv[1]))), indent=2))
