"""kvspec's torchvision stand-in for SGLang's environment (imported by the
driver before any SGLang module).

Why: ``sglang.srt.configs`` imports ``nano_nemotron_vl``, which imports
``sglang.srt.multimodal.internvl_utils``, which does ``import
torchvision.transforms as T`` and ``from torchvision.transforms.functional
import InterpolationMode`` at module level (SGLang 0.5.23). PyPI's
torchvision is a CUDA build that fails beside the CPU torch 2.13.0
(``operator torchvision::nms does not exist``). The radix cache and the
scheduler never touch image code, so kvspec stands in rather than installs.

What :func:`install` does: a meta-path finder answers every
``torchvision`` module name with a :class:`StubModule`. Any attribute of a
stub is a stub (so module-level ``import``/``from ... import`` lines and
class bodies that only *name* torchvision objects succeed); **calling** a
stub raises :class:`TorchvisionStubCalled`, naming what was called, so a real use
fails in one line instead of computing something wrong. vLLM's environment
uses another stub (``engine_adapter/live/stubs``), which makes torchvision
absent; this one is SGLang's only.

The same finder answers ``einops`` (absent from SGLang's CPU environment
here): the speculative path's ``speculative/spec_utils.py:40`` imports
``managers/utils.py``, whose expert-parallel metrics
(``eplb/expert_distribution.py:37``) do ``import einops`` at module level
and use it only when experts are redistributed, which the radix cache never
does.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

ROOT = "torchvision"
#: Every package the finder answers with stubs.
ROOTS = (ROOT, "einops")


class TorchvisionStubCalled(RuntimeError):
    """A stubbed torchvision object was used, not only named."""


class StubModule(types.ModuleType):
    """A torchvision module or attribute that only exists to be named."""

    __kvspec_stub__ = True

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        child = _module(f"{self.__name__}.{attr}")
        setattr(self, attr, child)
        return child

    def __call__(self, *args, **kwargs):
        raise TorchvisionStubCalled(
            f"kvspec's {self.__name__.split('.')[0]} stub: {self.__name__}(...) was called; "
            "SGLang's radix-cache driver runs no image or expert-distribution code"
        )

    def __mro_entries__(self, bases):
        return (object,)


def _module(name: str) -> StubModule:
    mod = sys.modules.get(name)
    if isinstance(mod, StubModule):
        return mod
    mod = StubModule(name, "kvspec torchvision stub (engine_adapter/sglang_engine/stubs.py)")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, _FINDER, is_package=True)
    mod.__path__ = []
    mod.__version__ = "0.0.0+kvspec.stub"
    sys.modules[name] = mod
    return mod


class _Finder:
    """Answers ``torchvision`` and ``einops`` and their submodules with stubs."""

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == r or fullname.startswith(r + ".") for r in ROOTS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _module(spec.name)

    def exec_module(self, module):
        return None


_FINDER = _Finder()


def install() -> None:
    """Put the finder first (idempotent). A torchvision made absent by
    another stub (``None`` in ``sys.modules``) is replaced; a real one
    already loaded is left alone."""
    real = sys.modules.get(ROOT)
    if real is not None and not isinstance(real, StubModule):
        return
    for name in [
        n for n, m in sys.modules.items() if (n == ROOT or n.startswith(ROOT + ".")) and not isinstance(m, StubModule)
    ]:
        del sys.modules[name]
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
