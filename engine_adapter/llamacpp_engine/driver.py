"""llama.cpp's server, in-process on CPU, real forward passes (the entry
point inside a llama.cpp environment).

What is llama.cpp's own, unchanged: the whole server (``xllamacpp.Server``
runs ``tools/server``'s ``server_context`` in-process: slot selection, the
RAM prompt cache, context checkpoints, the model's forward pass on the CPU
backend) and the deployment's resolution (:mod:`.resolve`). kvspec sends each
request of a case as ``handle_completions`` would receive it over HTTP:
token ids, greedy (``temperature`` 0, ``top_k`` 1), ``n_predict`` =
``max_tokens``, ``n_probs`` top log-probabilities, ``ignore_eos``.

Observed per request: the hit (``timings.cache_n``: the tokens the server
reused), the checkpoint events of the server's trace log (created /
restored / erased / evicted, by ``n_tokens``), the slot and what it held
after, the generated token ids and their top log-probabilities. With the
option ``cold`` each request is also run on a second, cold server (no
prompt cache, no checkpoints, ``cache_prompt`` off: every token computed),
whose tokens and log-probabilities the output oracle compares
(``fuzz.judge.oracle_outputs``).

Not driven (refused as ``Unsupported``): concurrent traces (arrivals), a
prompt that quotes a request's output (kvspec's output token is a
placeholder; the model's real outputs differ).
"""

from __future__ import annotations

import functools
import json
import sys
import time
import traceback

import xllamacpp

from engine_adapter.interface import (
    Observation,
    ReleaseOfPackage,
    RequestObservation,
    as_case,
    check_requests,
    family_deployment,
    served_observation,
)
from engine_adapter.llamacpp_engine import gguf_models, isolate, serverlog
from engine_adapter.llamacpp_engine.resolve import common_params, read_back
from ground.errors import InvalidArgument, KvspecError, Unsupported
from ground.printable import one_line
from reference.case import Case, prompt_tokens, quotes_output
from reference.tokens import TOKEN_VOCAB

MAX_LLAMACPP_REQUESTS = 64
MAX_PROMPT_TOKENS = 16384
MAX_NEW_TOKENS = 64
DEFAULT_N_PROBS = 5
#: llama.cpp keeps the checkpoint offsets of the first server that made one
#: in this process: ``static const int checkpoint_offsets[] = {4 + n_ubatch, 4}``
#: inside ``update_slots`` (server-context.cpp, snapshot 001d906a) is
#: initialised once. A later server of another ``n_ubatch`` in the same
#: process places its checkpoints with the first one's (docs/llamacpp.md,
#: finding L1). A real ``llama-server`` process runs one server, so kvspec
#: runs a case only where that static is unset or holds this case's
#: ``n_ubatch`` (else a harness error: run it in a fresh worker).
_PROCESS = {"offsets_n_ubatch": None}
#: The options a run takes.
OPTIONS = ("cold", "n_probs", "seed", "test_double", "first_server_n_ubatch")


_as_case = as_case
_deployment = functools.partial(family_deployment, family="llamacpp")


def check_case(case: Case) -> None:
    """What this driver does not drive is refused, never guessed."""
    check_requests(case, "llamacpp", MAX_LLAMACPP_REQUESTS)
    for i, r in enumerate(case.trace):
        if quotes_output(r):
            raise Unsupported(
                f"trace[{i}].prompt: quotes a request's output; allowed on llama.cpp: segments only (the real model's outputs are not kvspec's placeholder)"
            )
        if r.num_prompt_tokens > MAX_PROMPT_TOKENS:
            raise Unsupported(
                f"trace[{i}]: {r.num_prompt_tokens} prompt tokens; allowed on llama.cpp: at most {MAX_PROMPT_TOKENS}"
            )
        if not 1 <= r.max_tokens <= MAX_NEW_TOKENS:
            raise Unsupported(f"trace[{i}].max_tokens={r.max_tokens}: allowed on llama.cpp: 1..{MAX_NEW_TOKENS}")


def _options(options: dict | None) -> dict:
    options = dict(options or {})
    for k in options:
        if k not in OPTIONS:
            raise InvalidArgument(f"options.{k}: unknown; allowed: {', '.join(OPTIONS)}")
    n_probs = options.get("n_probs", DEFAULT_N_PROBS)
    if not isinstance(n_probs, int) or isinstance(n_probs, bool) or not 0 <= n_probs <= 20:
        raise InvalidArgument(f"options.n_probs={n_probs!r}: allowed: an integer in [0, 20]")
    seed = options.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise InvalidArgument(f"options.seed={seed!r}: allowed: an integer in [0, 2**31)")
    double = options.get("test_double")
    if double not in (None, "stale_restore"):
        raise InvalidArgument(
            f"options.test_double={double!r}: allowed: stale_restore (a test double of the restore step, unit tests only)"
        )
    first = options.get("first_server_n_ubatch")
    if first is not None and (not isinstance(first, int) or isinstance(first, bool) or not 1 <= first <= 4096):
        raise InvalidArgument(f"options.first_server_n_ubatch={first!r}: allowed: an integer in [1, 4096], or absent")
    return {
        "cold": bool(options.get("cold", True)),
        "n_probs": n_probs,
        "seed": seed,
        "test_double": double,
        "first_server_n_ubatch": first,
    }


def first_server(dep, seed: int, n_ubatch: int, log: serverlog.Capture) -> None:
    """Finding L1, reproduced as an embedder meets it: before the case, in
    the same process, a server of the same deployment with ``n_ubatch``
    (and ``n_batch`` at least that) prefills one prompt of ``2 n_ubatch +
    8`` tokens, which makes a checkpoint and so sets ``update_slots``'
    function-static ``checkpoint_offsets`` to {4 + n_ubatch, 4}."""
    params, _ = common_params(dep, seed, {"n_ubatch": n_ubatch, "n_batch": max(n_ubatch, 2048), "n_parallel": 1})
    served = _Served(params, log)
    served.complete(request_body(list(range(2 * n_ubatch + 8)), 1, 0))


#: Token ids a request may not generate (``logit_bias`` false): every
#: prompt token [0, TOKEN_VOCAB) and BOS/EOS, so a generated token is never a
#: token a later prompt holds. kvspec's prompts never quote outputs; had the
#: real model generated a later prompt's next token, the slot's common
#: prefix would run one token past the shared prompt (seen: seed 2, qwen3_next,
#: hit 283 over a 282-token shared prefix, reuse over the same tokens), which
#: the rule and every token-level oracle read against kvspec's placeholder
#: output. Generation draws from the output token and the spare ids.
BANNED = [[i, False] for i in range(TOKEN_VOCAB)] + [[gguf_models.BOS_ID, False], [gguf_models.EOS_ID, False]]


def request_body(tokens: list[int], max_tokens: int, n_probs: int) -> dict:
    """The body ``handle_completions`` receives: token ids, greedy, no
    generated token in the prompt alphabet (:data:`BANNED`)."""
    return {
        "prompt": list(tokens),
        "n_predict": max_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "n_probs": n_probs,
        "ignore_eos": True,
        "stream": False,
        "logit_bias": BANNED,
    }


def outputs_of(response: dict) -> tuple[list[int], list[list[list]]]:
    """Generated ids and, per token, its top ``[id, logprob]`` pairs."""
    content = ((response.get("choices") or [{}])[0].get("logprobs") or {}).get("content") or []
    ids = [int(c["id"]) for c in content]
    tops = [[[int(t["id"]), float(t["logprob"])] for t in c.get("top_logprobs", [])] for c in content]
    return ids, tops


#: The server's last load line (its settings are logged before it).
LOADED = "init: model loaded"


class _Served:
    """One llama.cpp server and its log."""

    def __init__(self, params, log: serverlog.Capture) -> None:
        start = log.size()
        self.server = xllamacpp.Server(params)
        isolate.keep(self.server)  # a child never destroys a server (isolate: the destructor's join can hang)
        # llama.cpp's logger (common_log) writes from a worker thread of its own,
        # so the load lines may land after the constructor returns (a fresh
        # clone's default tier read a load log without "n_slots"): read them
        # once the last one is there.
        self.load_log = log.wait_for(start, LOADED)
        self.log = log

    def complete(self, body: dict) -> tuple[dict, str]:
        start = self.log.size()
        response = self.server.handle_completions(body)
        if not isinstance(response, dict):
            raise TypeError(f"handle_completions returned {type(response).__name__}")
        if "error" in response:
            return response, self.log.read(start)
        return response, self.log.wait_for(start, "stop processing")


class LlamacppDriver(ReleaseOfPackage):
    """The llama.cpp family's driver (``engine_adapter.interface.FamilyDriver``)."""

    family = "llamacpp"

    def resolve(self, case) -> dict:
        """What llama.cpp resolves the case's deployment to, in a child
        process of its own (:mod:`.isolate`)."""
        case = _as_case(case)
        return isolate.in_child(lambda: self._resolve_here(case))

    def run(self, case, options: dict | None = None) -> Observation:
        """The case on a server of its own, in a child process of its own
        (:mod:`.isolate`: llama.cpp keeps process-wide state across servers,
        finding L1)."""
        case = _as_case(case)
        _options(options)
        check_case(case)
        _deployment(case)
        obs = isolate.in_child(lambda: self._run_here(case, options))
        if "engine" not in obs:
            obs["engine"] = self.name
        return obs

    def _resolve_here(self, case: Case) -> dict:
        dep = _deployment(case)
        params, info = common_params(dep)
        with serverlog.Capture() as log:
            served = _Served(params, log)
            settings = serverlog.resolved_settings(served.load_log)
            del served
        return {
            "engine": self.name,
            "deployment": dep.as_dict(),
            **info,
            "params": read_back(params),
            "server": settings,
            # what a campaign draws traces on: llama.cpp matches token by token
            "facts": {
                "block": 1,
                "hash": 1,
                "max_model_len": settings.get("n_ctx_slot"),
                "max_num_seqs": settings.get("n_slots") or 1,
            },
        }

    def _run_here(self, case: Case, options: dict | None) -> Observation:
        t0 = time.perf_counter()
        opts = _options(options)
        check_case(case)
        dep = _deployment(case)
        params, info = common_params(dep, opts["seed"])
        prompts = [prompt_tokens(r) for r in case.trace]
        explain: list[RequestObservation] = []
        error = None
        with serverlog.Capture() as log:
            try:
                served = _Served(params, log)
            except Exception as e:  # noqa: BLE001 - the server refused the deployment: llama.cpp's answer
                return self._failed(case, "config", None, e, info, t0)
            settings = serverlog.resolved_settings(served.load_log)
            if opts["first_server_n_ubatch"] is not None:  # L1 asked for: the static set by another server
                first_server(dep, opts["seed"], opts["first_server_n_ubatch"], log)
                _PROCESS["offsets_n_ubatch"] = opts["first_server_n_ubatch"]
            stale = _PROCESS["offsets_n_ubatch"]
            if (
                settings["n_ctx_checkpoints"]
                and stale is not None
                and stale != settings["n_ubatch"]
                and opts["first_server_n_ubatch"] is None
            ):
                del served
                return served_observation(
                    self.name,
                    [],
                    resolution={**info, "server": settings},
                    error={
                        "kind": "worker",
                        "phase": "config",
                        "request": None,
                        "type": "StaleProcess",
                        "message": f"this process's llama.cpp keeps the checkpoint offsets of an earlier server (n_ubatch {stale}); "
                        f"this case's n_ubatch is {settings['n_ubatch']}: run it in a fresh worker",
                    },
                )
            if settings["n_ctx_checkpoints"]:
                _PROCESS["offsets_n_ubatch"] = settings["n_ubatch"]
            cold = None
            if opts["cold"]:
                cparams, _ = common_params(
                    dep,
                    opts["seed"],
                    {"cache_ram_mib": 0, "n_ctx_checkpoints": 0, "cache_prompt": False, "n_parallel": 1},
                )
                cold = _Served(cparams, log)
            if opts["test_double"] == "stale_restore":
                from engine_adapter.llamacpp_engine.doubles import StaleRestore

                served = StaleRestore(served)
            t1 = time.perf_counter()
            held: dict[int, list[int]] = {}
            for i, (req, tokens) in enumerate(zip(case.trace, prompts)):
                try:
                    explain.append(self._serve(served, cold, i, tokens, req.max_tokens, opts["n_probs"], held))
                except KvspecError:
                    raise
                except Exception as e:  # noqa: BLE001 - kvspec's own failure, reported as such
                    error = {
                        "kind": "internal",
                        "phase": "step",
                        "request": i,
                        "type": type(e).__name__,
                        "message": one_line(e, 500) or type(e).__name__,
                        "traceback": traceback.format_exc()[-4000:],
                    }
                    break
                if explain[-1].get("engine_error"):
                    error = {
                        "kind": "llamacpp",
                        "phase": "step",
                        "request": i,
                        "type": "ServerError",
                        "message": one_line(explain[-1]["engine_error"], 500),
                    }
                    explain.pop()
                    break
            del served, cold
        out: Observation = served_observation(
            self.name,
            explain,
            resolution={**info, "params": read_back(params), "server": settings},
            timing={"setup_s": round(t1 - t0, 4), "run_s": round(time.perf_counter() - t1, 4)},
            harness={
                "cold": opts["cold"],
                "n_probs": opts["n_probs"],
                "seed": opts["seed"],
                "test_double": opts["test_double"],
                "first_server_n_ubatch": opts["first_server_n_ubatch"],
                # what a finding replays with (never the test double: its findings are not llama.cpp's)
                **(
                    {"options": {"first_server_n_ubatch": opts["first_server_n_ubatch"]}}
                    if opts["first_server_n_ubatch"] is not None
                    else {}
                ),
                "model_recipe": gguf_models.recipe(info["arch"], opts["seed"]).key(),
            },
        )
        if error:
            out["error"] = error
        return out

    def _failed(self, case: Case, phase: str, request, e: BaseException, info: dict, t0: float) -> Observation:
        return served_observation(
            self.name,
            [],
            resolution=info,
            timing={"setup_s": round(time.perf_counter() - t0, 4)},
            error={
                "kind": "llamacpp",
                "phase": phase,
                "request": request,
                "type": type(e).__name__,
                "message": one_line(e, 500) or type(e).__name__,
            },
        )

    def _serve(
        self, served, cold, i: int, tokens: list[int], max_tokens: int, n_probs: int, held: dict[int, list[int]]
    ) -> RequestObservation:
        response, text = served.complete(request_body(tokens, max_tokens, n_probs))
        if "error" in response:
            return {"request": i, "engine_error": json.dumps(response.get("error"))[:500]}
        ev = serverlog.events(text)
        slot = ev["slot"] if ev["slot"] is not None else 0
        cached = held.setdefault(
            -1, []
        )  # the RAM prompt cache: [[length, checkpoints], ...], as the log saves and loads them
        for op, who, n in ev["cache_ops"]:
            if op == "save":
                cached.append([n, list(held.get(slot if who is None else who, []))])
            elif op == "skip" and cached:
                cached.pop()
            elif op == "obsolete":
                match = [c for c in cached if c[0] == n]
                if match:
                    cached.remove(match[0])
            elif op == "load":
                match = [c for c in cached if c[0] == n]
                held[slot] = list(match[-1][1]) if match else []
                if match:
                    cached.remove(match[-1])
        cps = held.setdefault(slot, [])
        for kind, n in ev["order"]:  # the slot's checkpoint list, as the events changed it
            if kind in ("erased", "evicted", "superseded") and n in cps:
                cps.remove(n)
            elif kind == "created":
                cps.append(n)
        ids, tops = outputs_of(response)
        obs: RequestObservation = {
            "request": i,
            "prompt_tokens": len(tokens),
            "hit": int(response["timings"]["cache_n"]),
            "query": len(tokens),
            "lookups": 1,
            "slot": slot,
            "slot_tokens": ev["slot_tokens"],
            "checkpoints_created": ev["created"],
            "checkpoint_restored": ev["restored"][-1] if ev["restored"] else None,
            "checkpoints_erased": ev["erased"] + ev["evicted"],
            "checkpoints_held": sorted(cps),
            "forced_full": ev["forced_full"],
            "prompt_cache_load": ev["prompt_cache_load"],
            "output_ids": ids,
            "top_logprobs": tops,
        }
        if cold is not None:
            cresp, _ = cold.complete(request_body(tokens, max_tokens, n_probs))
            if "error" in cresp:
                return {"request": i, "engine_error": json.dumps(cresp.get("error"))[:500]}
            obs["cold_output_ids"], obs["cold_top_logprobs"] = outputs_of(cresp)
            obs["cold_hit"] = int(cresp["timings"]["cache_n"])
        return obs


@functools.cache
def get_driver() -> LlamacppDriver:
    return LlamacppDriver()


def selftest_case() -> dict:
    """A, its resend, a longer sibling on granitehybrid, one slot."""
    from engine_adapter.inside import selftest as inside_selftest

    return inside_selftest.case_beside(__file__)


IMPORT_CHECK = ("xllamacpp", "gguf")


def selftest(expect_version: str | None, out, *, import_only: bool = False) -> int:
    """Import the stack and, unless ``import_only``, run :func:`selftest_case`
    (the resend must hit, cached and cold outputs the same)."""
    from engine_adapter.inside import selftest as inside_selftest

    loaded = inside_selftest.load(get_driver, "llama.cpp", expect_version)
    if loaded is None:
        return 1
    driver, import_s = loaded
    summary = {"vllm_version": driver.version, "engine": driver.name, "import_s": round(import_s, 2)}
    if import_only:
        return inside_selftest.import_only(out, IMPORT_CHECK, summary)
    result = driver.run(selftest_case(), {"cold": True})
    if result.get("error"):
        print(f"selftest: llama.cpp raised: {result['error']['message']}", file=sys.stderr)
        return 1
    same = all(e["output_ids"] == e["cold_output_ids"] for e in result["explain"])
    if not (result["hits"][0] == 0 and result["hits"][1] > 0 and same):
        print(
            f"selftest: implausible hits {result['hits']} or outputs differ from a cold server ({same})",
            file=sys.stderr,
        )
        return 1
    out.write(json.dumps({**summary, "hits": result["hits"]}) + "\n")
    out.flush()
    return 0
