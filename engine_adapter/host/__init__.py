"""The host side of the engine package: code that runs in kvspec's own
interpreter and never imports an engine. Environments and builds per
release (one install transaction, :mod:`engine_adapter.host.venvs`), warm
engines, the worker client (:mod:`engine_adapter.host.engine`), engine names
(:mod:`engine_adapter.host.versions`)."""
