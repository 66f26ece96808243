"""A TEST DOUBLE of llama.cpp's restore step, for the output oracle's own
test (``tests/llamacpp/test_output_oracle.py``); never used in a
differential check.

The wheel cannot be patched here (``xllamacpp`` ships llama.cpp compiled;
kvspec does not rebuild it), so the planted fault stands *around* the server:
:class:`StaleRestore` serves every request that shares a prefix with an
earlier one as if the state restored for it had been computed over a
different first token (a stale state: the class of bug #24055's
invalidation guards against). Its outputs are real llama.cpp outputs of a
different computation, so a correct oracle must report different tokens
or log-probabilities against the cold server.
"""

from __future__ import annotations


class StaleRestore:
    """Wraps a served llama.cpp server; named as a test double."""

    is_test_double = True

    def __init__(self, served) -> None:
        self.served = served
        self.seen: list[list[int]] = []

    def complete(self, body: dict):
        tokens = list(body["prompt"])
        shares = any(p[:1] == tokens[:1] for p in self.seen)
        self.seen.append(tokens)
        if shares and len(tokens) > 1:
            body = {**body, "prompt": [tokens[0] % 1000 + 1 if tokens[0] != tokens[0] % 1000 + 1 else tokens[0] + 1, *tokens[1:]]}
        return self.served.complete(body)
