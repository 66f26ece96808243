"""kvspec's torchvision stub for the live-tier CPU vLLM server ONLY.

Why: importing vLLM's ``qwen3_5`` model pulls ``qwen3_vl``, which imports
transformers' Qwen2-VL image processor, which does an unconditional
``from torchvision.transforms.v2 import functional``. PyPI's torchvision is a
CUDA build that fails to import beside the CPU torch 2.13.0 (``operator
torchvision::nms does not exist``); the CUDA torch+torchvision pair on this
disk is 5.5 GB. A text-only model served with token-id prompts never touches
image or video code, so we stub rather than install.

What :func:`install` does, in the importing process:

* ``sys.modules["torchvision"] = None``: ``import torchvision`` fails cleanly
  with ImportError, and ``importlib.util.find_spec("torchvision")`` returns
  None, so ``transformers.utils.is_torchvision_available()`` is False and
  transformers (and vLLM) take their no-torchvision paths;
* registers ``torchvision.transforms.v2`` and
  ``torchvision.transforms.v2.functional`` as stub modules so that the one
  unconditional import above succeeds. Any attribute of them raises
  :class:`StubUnavailable` (an AttributeError) naming it, so a real use fails
  loudly in one line instead of computing something wrong.

Where: ``engine_adapter.live.server`` puts this folder on the server's
``PYTHONPATH`` and sets ``KVSPEC_TORCHVISION_STUB=1``; ``sitecustomize`` here
then calls :func:`install` in the API server and in each engine process it
spawns. Nothing is installed into any environment; kvspec itself never
loads it.
"""

from __future__ import annotations

import sys
import types

ENV_VAR = "KVSPEC_TORCHVISION_STUB"
STUBBED = ("torchvision.transforms.v2", "torchvision.transforms.v2.functional")


class StubUnavailable(AttributeError):
    """Raised on any use of a stubbed torchvision attribute."""


class _StubModule(types.ModuleType):
    __kvspec_stub__ = True

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise StubUnavailable(
            f"kvspec's torchvision stub: {self.__name__}.{attr} is not available on the live-tier CPU server "
            "(text-only model, token-id prompts; no image or video processing)"
        )


def install() -> None:
    """Make torchvision absent except for the stubbed module names (idempotent)."""
    if "torchvision" in sys.modules and sys.modules["torchvision"] is not None:
        return  # a real torchvision is already loaded; leave it alone
    sys.modules["torchvision"] = None  # type: ignore[assignment]
    parent = None
    for name in STUBBED:
        mod = sys.modules.get(name)
        if not isinstance(mod, _StubModule):
            mod = _StubModule(name, "kvspec torchvision stub (see kvspec_torchvision_stub.py)")
            sys.modules[name] = mod
        if parent is not None:
            parent.__dict__[name.rsplit(".", 1)[1]] = mod
        parent = mod
