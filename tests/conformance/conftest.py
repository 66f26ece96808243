"""The engine session fixture of tests/engine, shared (one 0.33.0 worker)."""

from tests.engine.conftest import engines  # noqa: F401
