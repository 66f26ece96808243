"""The llama.cpp family's own checks, declared in its registry line
(``ground.engines.Family.own_checks``): the ``reference`` and ``promise``
oracles judge a llama.cpp observation by these, every other oracle as it
judges any engine (the safety oracles, ``outputs``, ``engine_error``).

* ``reference`` (:func:`check_rule`): every request's hit and the
  checkpoints its slot holds after equal llama.cpp's rule
  (:mod:`reference.llamacpp`) on the settings the server resolved
  (``observation.resolution.server``: read back from its load log).
* ``promise`` (:func:`check_slot_promise`): the promise stated for what
  llama.cpp promises, one live state per slot plus the checkpoint it makes
  4 tokens before every prompt's end. On one slot (``--parallel 1``) with
  the prompt cache (``cache_prompt``) and checkpoints on
  (``--ctx-checkpoints`` >= 1), a request whose prompt starts with the
  whole prompt of the request just before it (an identical resend, or a
  longer sibling) resumes at no less than that prompt's length minus 4,
  when that is at least 1. Why it must: the earlier prefill's last batch
  starts at max(its hit, M-4) > 0 and a checkpoint is made there
  (``update_slots``, the prompt batch loop: ``checkpoint_offsets`` {4 +
  n_ubatch, 4}, server-context.cpp at 001d906a); the new request's common
  prefix with the slot is at least M, so either the slot's own state is
  used (all it holds is a prefix) or the newest checkpoint at or below the
  common prefix is restored (SLOT_STATE_STARTED, ``pos_min_thold``), which
  is at or above M-4. Below is lost reuse; above is judged by the safety
  oracles and ``outputs``, never by this number. It asks less than
  kvspec's engine-neutral promise (a resend at N-1, a sibling at the earlier
  prompt's end): the difference is llama.cpp's design (docs/llamacpp.md),
  stated, not flagged. A request after a diverging sibling, or on several
  slots, is not promised anything (the RAM prompt cache is looked up only
  when the slot keeps under half of what it holds).
"""

from __future__ import annotations

from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import Divergence, reference_divergence
from reference.case import Case, prompt_tokens
from reference.llamacpp import Settings, predict

#: llama.cpp's checkpoint nearest a prompt's end: ``checkpoint_offsets``'
#: last entry (server-context.cpp, ``update_slots``, snapshot 001d906a).
END_OFFSET = 4


def _settings(obs: Observation) -> Settings | None:
    res = obs.get("resolution") or {}
    if not res.get("server"):
        return None
    return Settings.of(res["server"], res.get("params") or {})


def check_rule(case: Case, version: str, obs: Observation) -> list[Divergence]:
    """``reference`` on llama.cpp: hits and checkpoints held equal the rule."""
    st = _settings(obs)
    if st is None:
        return []
    ref = predict(case, st)
    hits = list(obs.get("hits") or [])
    bad, details = [], []
    for i, (r, o) in enumerate(zip(ref["explain"], obs.get("explain") or [])):
        if r["hit"] != o.get("hit"):
            bad.append(i)
            details.append(f"request {i}: hit {o.get('hit')} by llama.cpp, {r['hit']} by the rule")
        elif r["checkpoints_held"] != o.get("checkpoints_held"):
            bad.append(i)
            details.append(
                f"request {i}: checkpoints held {o.get('checkpoints_held')} by llama.cpp, {r['checkpoints_held']} by the rule"
            )
    if not bad:
        return []
    return reference_divergence(
        version, bad, ref["hits"][: len(hits)], hits, "rule=llamacpp; " + "; ".join(details)[:2000], ref["explain"]
    )


def slot_promise(case: Case, st: Settings) -> list[int | None]:
    """The least hit llama.cpp promises each request (None: nothing promised)."""
    if st.n_parallel != 1 or not st.cache_prompt or st.n_ctx_checkpoints < 1:
        return [None] * len(case.trace)
    out: list[int | None] = [None]
    prompts = [prompt_tokens(r) for r in case.trace]
    for i in range(1, len(prompts)):
        prev, cur = prompts[i - 1], prompts[i]
        least = len(prev) - END_OFFSET
        out.append(least if least >= 1 and cur[: len(prev)] == prev else None)
    return out


def check_slot_promise(case: Case, version: str, obs: Observation) -> list[Divergence]:
    """``promise`` on llama.cpp: no promised request hits below its least."""
    st = _settings(obs)
    if st is None:
        return []
    hits = list(obs.get("hits") or [])
    least = slot_promise(case, st)
    bad = [i for i, h in enumerate(hits) if i < len(least) and least[i] is not None and h < least[i]]
    if not bad:
        return []
    expected = [least[i] if i in bad else h for i, h in enumerate(hits)]
    i = bad[0]
    detail = (
        f"request {i} starts with the whole {len(prompt_tokens(case.trace[i - 1]))}-token prompt of the request before it "
        f"on one slot, and resumed at {hits[i]}, below {least[i]} (the checkpoint llama.cpp makes {END_OFFSET} tokens before that prompt's end)"
    )
    return [Divergence("promise", version, bad, expected, hits, detail, {"promised_at_least": least})]


#: The family's checks by oracle name (``ground.engines.Family.own_checks``).
CHECKS = {"reference": check_rule, "promise": check_slot_promise}
