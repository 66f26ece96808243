"""The one rule for what an exception around a vLLM call is
(``engine_adapter.vllm_engine.failure.vllm_outcome``): vLLM refusing, vLLM crashing, or
kvspec's own failure. Frames are compiled with file names under a stand-in
vLLM root and under kvspec's own packages, so no engine is needed; the real
engine's side is in ``test_resolve.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.vllm_engine import failure
from engine_adapter.vllm_engine.failure import REFUSALS, raised_by_vllm, vllm_outcome

REPO = Path(failure.__file__).resolve().parents[1]


def _chain(files: list[Path], exc: BaseException) -> BaseException:
    """Raise ``exc`` from a call chain whose frames carry ``files`` (outermost
    first), and return it with that traceback."""
    namespace: dict = {"exc": exc}
    for i, f in reversed(list(enumerate(files))):
        body = "raise exc" if i == len(files) - 1 else f"f{i + 1}()"
        exec(compile(f"def f{i}():\n    {body}\n", str(f), "exec"), namespace)
    try:
        namespace["f0"]()
    except BaseException as e:  # noqa: BLE001 - the exception under test
        return e
    raise AssertionError("the chain did not raise")


@pytest.fixture
def vllm_root(tmp_path):
    return tmp_path / "site-packages" / "vllm"


def kvspec(name: str) -> Path:
    return REPO / "engine_adapter" / "vllm_engine" / name


def test_an_exception_vllm_raises_is_a_refusal_or_a_crash_by_where_it_was_raised(vllm_root):
    deep_in_vllm = [
        kvspec("resolve.py"),
        vllm_root / "v1" / "core" / "kv_cache_utils.py",
        Path("/usr/lib/python3.11/json/__init__.py"),
    ]
    table = {
        ("config", ValueError): "refused",
        ("config", AssertionError): "refused",
        ("config", TypeError): "crashed",
        ("kv_cache", ValueError): "refused",
        ("kv_cache", NotImplementedError): "refused",
        ("kv_cache", IndexError): "crashed",
        ("scheduler", ValueError): "refused",
        ("scheduler", AssertionError): "crashed",
        ("run", ValueError): "crashed",
        ("run", AssertionError): "crashed",
        ("hand", ValueError): "crashed",
    }
    for (where, kind), expected in table.items():
        e = _chain(deep_in_vllm, kind("x"))
        assert vllm_outcome(e, where, vllm_root) == expected, (where, kind)


def test_kvspecs_own_exceptions_are_never_vllms(vllm_root):
    # a stand-in vLLM calls back (kvspec below vLLM), kvspec's glue alone,
    # and a module missing from the engine environment kvspec built
    callback = [kvspec("resolve.py"), vllm_root / "v1" / "worker" / "utils.py", kvspec("standins.py")]
    glue = [kvspec("steploop.py"), kvspec("observe.py")]
    missing = [kvspec("resolve.py"), vllm_root / "model_executor" / "models" / "qwen3_5.py"]
    assert vllm_outcome(_chain(callback, IndexError("x")), "kv_cache", vllm_root) is None
    assert vllm_outcome(_chain(glue, KeyError("req-0")), "run", vllm_root) is None
    assert vllm_outcome(_chain(missing, ModuleNotFoundError("torchvision")), "config", vllm_root) is None
    not_inspected = ValueError(
        "Model architectures ['Qwen3_5ForCausalLM'] failed to be inspected. Please check the logs for more details."
    )
    assert (
        vllm_outcome(
            _chain([kvspec("resolve.py"), vllm_root / "model_executor" / "models" / "registry.py"], not_inspected),
            "config",
            vllm_root,
        )
        is None
    )
    assert vllm_outcome(ValueError("never raised: no traceback"), "config", vllm_root) is None
    # a file outside both (the test's own, a library vLLM calls) decides nothing
    assert raised_by_vllm(_chain([kvspec("steploop.py"), vllm_root / "x.py", Path(__file__)], IndexError()), vllm_root)


def test_every_where_is_named_and_an_unknown_one_is_refused(vllm_root):
    assert set(REFUSALS) == {"config", "kv_cache", "scheduler", "run", "hand"}
    with pytest.raises(KeyError, match="where='setup'"):
        vllm_outcome(ValueError(), "setup", vllm_root)
