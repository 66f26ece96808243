"""The engine tests here share the session's engine workers
(``tests/engine/conftest.py``: one per vLLM version, started lazily)."""

from tests.engine.conftest import engine_029, engine_033, engines  # noqa: F401 - pytest fixtures, re-exported
