"""A TEST DOUBLE of llama.cpp's restore step, for the output oracle's own
test (``tests/llamacpp/test_output_oracle.py``); never used in a
differential check.

The wheel cannot be patched here (``xllamacpp`` ships llama.cpp compiled;
kvspec does not rebuild it), so the planted fault stands *around* the server:
:class:`StaleRestore` serves every request that shares a prefix with an
earlier one as if the state restored for it had been computed over a
different first token (a stale state: the class of bug #24055's
invalidation guards against): the 16 tokens before the last checkpoint
llama.cpp could restore for it (4 before the shared prefix's end) are
replaced, as a state computed over another conversation's recent tokens
would carry them. (A changed first token alone barely moves a recurrent
state 1,000 tokens later: the model forgets it.) Its outputs are real llama.cpp outputs of a
different computation, so a correct oracle must report different tokens
or log-probabilities against the cold server.
"""

from __future__ import annotations

from reference.serial import common_prefix


class StaleRestore:
    """Wraps a served llama.cpp server; named as a test double."""

    is_test_double = True

    def __init__(self, served) -> None:
        self.served = served
        self.seen: list[list[int]] = []

    def complete(self, body: dict):
        tokens = list(body["prompt"])
        shared = max((common_prefix(p, tokens) for p in self.seen), default=0)
        self.seen.append(tokens)
        if shared >= 24:
            end = shared - 4
            tokens[end - 16 : end] = [(t % 1000) + 1 if (t % 1000) + 1 != t else t + 1 for t in tokens[end - 16 : end]]
            body = {**body, "prompt": tokens}
        return self.served.complete(body)
