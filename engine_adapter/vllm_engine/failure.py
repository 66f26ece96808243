"""A vLLM failure on a case: what vLLM raised, in which phase, at which request;
and the one rule that says whether an exception is vLLM refusing a
deployment, vLLM crashing, or kvspec's own failure.

A failure is a result, not a crash: the driver returns it as ``"error":
{"kind": "vllm", ...}`` beside the requests that finished before it. Only
this kind can become a finding; kvspec's own failures (``internal``,
``worker``) are harness errors.

:func:`vllm_outcome` classifies an exception caught around a call into
vLLM (vLLM 0.29.0-0.33.0):

* **kvspec's** (``None``: the caller re-raises it to the harness): an
  ``ImportError``, or vLLM saying a model class it supports "failed to be
  inspected" (a module missing from the engine environment kvspec built),
  or one whose deepest frame in vLLM's package is above the
  deepest frame in kvspec's own packages (kvspec's stand-ins and
  observers, which vLLM calls back; an exception with no vLLM frame, except
  pydantic's ``ValidationError`` for one of vLLM's config classes, which
  carries no frame of vLLM's validator).
* **refused**: vLLM checking what it was asked for, where it checks it.
  Building the config and the KV cache (``where`` = ``config`` /
  ``kv_cache``): ``ValueError`` (pydantic's ``ValidationError`` is one),
  ``AssertionError``, ``NotImplementedError``. When the scheduler starts
  (``scheduler``): ``ValueError`` only (vLLM validates the retention
  interval against the resolved block there); every check of the
  configuration has passed by then, so a failed ``assert`` is an invariant
  the built configuration breaks. Nothing is a refusal once requests run
  (``run``), nor on a hand geometry (``hand``: kvspec chose the groups;
  what vLLM raises on them is reported, and ``reachability`` labels it).
* **crashed**: anything else vLLM raised: a :class:`VllmFailure`, judged
  by the ``engine_error`` oracle.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Literal, NoReturn

from ground.errors import DeploymentRejected
from ground.home import REPO_ROOT
from ground.printable import one_line

_TRACEBACK_LIMIT = 20000
#: kvspec's own packages (a frame there is kvspec's code, not vLLM's).
KVSPEC_PACKAGES = ("engine_adapter", "reference", "fuzz", "kvspec", "mutate", "spec", "advise")
_VALIDATION = (ValueError, AssertionError, NotImplementedError)
#: vLLM's words (``ModelRegistry._raise_for_unsupported``, 0.29.0-0.33.0)
#: when a model class it supports could not be imported: in kvspec, a
#: package missing from the engine environment, never a refusal.
MODEL_CLASS_NOT_INSPECTED = "failed to be inspected"
#: What vLLM raises to refuse a deployment, by where it was raised.
REFUSALS: dict[str, tuple[type[BaseException], ...]] = {
    "config": _VALIDATION,
    "kv_cache": _VALIDATION,
    "scheduler": (ValueError,),
    "run": (),
    "hand": (),
}


class VllmFailure(Exception):
    """vLLM raised (or misbehaved) while running a case: a finding, not a crash."""

    def __init__(
        self, phase: str, exc: BaseException | None = None, message: str | None = None, request: int | None = None
    ):
        self.phase = phase
        self.exc = exc
        self.request = request
        self.tb = "".join(traceback.format_exception(exc))[-_TRACEBACK_LIMIT:] if exc is not None else None
        super().__init__(message or f"{type(exc).__name__}: {exc}")

    def as_dict(self) -> dict:
        return {
            "kind": "vllm",
            "phase": self.phase,
            "request": self.request,
            "type": type(self.exc).__name__ if self.exc is not None else "EngineStall",
            "message": str(self)[:2000],
            "traceback": self.tb,
        }


def _frame_files(e: BaseException) -> list[Path]:
    files = []
    tb = e.__traceback__
    while tb is not None:
        files.append(Path(tb.tb_frame.f_code.co_filename))
        tb = tb.tb_next
    return files


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
    except (ValueError, OSError):
        return False
    return True


def raised_by_vllm(e: BaseException, vllm_root: Path | None = None) -> bool:
    """Whether ``e`` is vLLM's: its traceback's deepest frame in vLLM's
    package (``vllm_root``: the imported ``vllm``'s) lies below every frame
    in kvspec's packages (a call into torch or pydantic from vLLM is vLLM's;
    a stand-in vLLM calls back is kvspec's)."""
    if vllm_root is None:
        import vllm

        vllm_root = Path(vllm.__file__).resolve().parent
    vllm_root = vllm_root.resolve()
    ours = [REPO_ROOT / p for p in KVSPEC_PACKAGES]
    last_vllm = last_ours = -1
    for i, f in enumerate(_frame_files(e)):
        if _under(f, vllm_root):
            last_vllm = i
        elif any(_under(f, r) for r in ours):
            last_ours = i
    return last_vllm > last_ours or _vllm_config_validation(e)


def _vllm_config_validation(e: BaseException) -> bool:
    """pydantic's ``ValidationError`` for one of vLLM's config classes
    (``e.title``, e.g. ``SpeculativeConfig``): pydantic-core raises it
    without the frames of vLLM's validator that failed."""
    if type(e).__module__.split(".")[0] not in ("pydantic", "pydantic_core"):
        return False
    cls = getattr(sys.modules.get("vllm.config"), str(getattr(e, "title", "")), None)
    return isinstance(cls, type) and cls.__module__.startswith("vllm.")


def vllm_outcome(e: BaseException, where: str, vllm_root: Path | None = None) -> Literal["refused", "crashed"] | None:
    """``refused`` / ``crashed`` for an exception vLLM raised ``where``
    (a key of :data:`REFUSALS`), ``None`` when it is kvspec's (the module
    docstring states the rule)."""
    if where not in REFUSALS:
        raise KeyError(f"where={where!r}: allowed: {', '.join(REFUSALS)}")
    if isinstance(e, ImportError) or MODEL_CLASS_NOT_INSPECTED in str(e) or not raised_by_vllm(e, vllm_root):
        return None
    return "refused" if isinstance(e, REFUSALS[where]) else "crashed"


def vllm_message(e: BaseException) -> str:
    """vLLM's own words for an exception, on one line: a pydantic validation
    error gives its first message (and field), anything else its text."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            msg = str(first.get("msg", "")).removeprefix("Value error, ")
            loc = ".".join(str(x) for x in first.get("loc", ()) if x not in ("__root__",))
            return one_line(f"{loc}: {msg}" if loc else msg, 400)
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return one_line(f"{type(e).__name__}: {e}", 400)


def raise_outcome(e: Exception, where: str, refused: str, phase: str = "setup") -> NoReturn:
    """Raise what ``e`` is (:func:`vllm_outcome`): vLLM
    refusing (``DeploymentRejected``, ``refused: <vLLM's words>``), vLLM crashing
    (``VllmFailure`` of ``phase``), or kvspec's own error (``e`` itself)."""
    outcome = vllm_outcome(e, where)
    if outcome == "refused":
        raise DeploymentRejected(f"{refused}: {vllm_message(e)}") from None
    if outcome == "crashed":
        raise VllmFailure(phase, e) from None
    raise e
