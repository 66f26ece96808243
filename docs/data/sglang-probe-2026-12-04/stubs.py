"""Stub out heavy/GPU-only optional modules that sglang imports at module level
but that the radix-cache path never calls. Import this before any sglang module."""
import sys, types, importlib.machinery

class _Anything(types.ModuleType):
    """A module whose every attribute is another stub (callable, subscriptable)."""
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        m = sys.modules.get(full)
        if m is None:
            m = _make(full)
        setattr(self, name, m)
        return m
    def __call__(self, *a, **k):
        return self
    def __mro_entries__(self, bases):
        return (object,)

def _make(name):
    m = _Anything(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__path__ = []
    m.__version__ = "0.0.0"
    sys.modules[name] = m
    return m

class _Finder:
    def __init__(self, roots):
        self.roots = set(roots)
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None
    def create_module(self, spec):
        return _make(spec.name)
    def exec_module(self, module):
        pass

import os
STUBBED = ["torchvision"] + [m for m in os.environ.get("PROBE_EXTRA_STUBS", "").split(",") if m]
sys.meta_path.insert(0, _Finder(STUBBED))
