"""The generated ids and top log-probabilities of a streamed OpenAI
``/v1/completions`` response (``logprobs`` N, ``return_tokens_as_token_ids``:
every token is ``token_id:ID``), for the output oracle live
(``fuzz.replaying.live_replay``, ``kvspec replay --server URL --outputs``). Read
bounded: a stranger's stream."""

from __future__ import annotations

from ground.errors import EngineError


class LogprobsError(EngineError):
    """A completion's log-probabilities are not what the output oracle reads."""


#: The most generated tokens one completion's log-probabilities are read for.
MAX_LOGPROB_TOKENS = 4096


def _token_id(text: object) -> int:
    """``token_id:123`` (``return_tokens_as_token_ids``) -> 123."""
    if not isinstance(text, str) or not text.startswith("token_id:") or not text[9:].isdigit() or len(text) > 30:
        raise LogprobsError(f"stream: token {str(text)[:40]!r}; allowed: token_id:N (return_tokens_as_token_ids)")
    return int(text[9:])


def logprobs_into(event: object, ids: list[int], tops: list[list[list]]) -> None:
    """Append a chunk's generated ids and top log-probabilities (OpenAI
    completions ``logprobs``: ``tokens``, ``top_logprobs``), bounded."""
    choices = event.get("choices") if isinstance(event, dict) else None
    lp = choices[0].get("logprobs") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if not isinstance(lp, dict):
        return
    tokens, top = lp.get("tokens") or [], lp.get("top_logprobs") or []
    if not isinstance(tokens, list) or not isinstance(top, list) or len(ids) + len(tokens) > MAX_LOGPROB_TOKENS:
        raise LogprobsError("stream: logprobs malformed or too long; allowed: OpenAI completion logprobs")
    for k, tok in enumerate(tokens):
        ids.append(_token_id(tok))
        entry = top[k] if k < len(top) and isinstance(top[k], dict) else {}
        tops.append([[_token_id(t), float(v)] for t, v in list(entry.items())[:20] if isinstance(v, (int, float))])
