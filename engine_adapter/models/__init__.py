"""Shipped model configs (``<name>.json``); see :mod:`engine_adapter.models.shipped`."""

from engine_adapter.models.shipped import SHIPPED, config_path, load_config, names

__all__ = ["SHIPPED", "config_path", "load_config", "names"]
