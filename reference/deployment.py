"""A deployment: what a user runs (a model config plus ``vllm serve`` flags),
as opposed to a hand geometry.

A case may carry ``"deployment"`` instead of ``"geometry"`` and
``"speculative"``::

    {"schema": 1, "name": "qwen3-next-tp2-fp8-mtp2",
     "deployment": {"model": "qwen3_next",
                    "model_overrides": {"num_hidden_layers": 8},
                    "vllm_args": ["--tensor-parallel-size", "2",
                                  "--kv-cache-dtype", "fp8",
                                  "--speculative-config",
                                  "{\\"method\\": \\"mtp\\", \\"num_speculative_tokens\\": 2}"],
                    "platform": "cuda", "device": "h100"},
     "trace": [...]}

The geometry (block sizes, hash unit, retention, chunk budget) and the
speculative settings are not written by hand: they are what vLLM's own code
resolves for that deployment, in the engine environment of the version
under test (``engine_adapter.vllm_engine.resolve``). This module only checks the shape
of the block (every rule names its field); whether vLLM accepts the flags is
vLLM's answer, reported by the resolver in one line.

A deployment comes from strangers and never loads code: ``vllm_args`` may
carry only the cache-geometry, scheduling, parallelism and speculative flags
of ``reference.vllm_flags`` (an allow-list, read as vLLM's parser reads it;
``--speculative-config`` keys included), and ``model_overrides`` follows
``reference.model_config``'s rules (no ``auto_map`` or other code-loading
key, at most 1,024 layers, dimensions at most 1,048,576); a user's
config.json is held to the same rules before vLLM reads it.

A *resolved* case carries the deployment, the geometry and speculative
settings one engine resolved, and ``"resolved_by": "vllm==X"``; the
reference model reads the geometry directly when asked for that version, and
any other version resolves the deployment again.

``model`` is a model shipped with kvspec (``engine_adapter/models/``: the
``transformers`` configuration class defaults of each architecture) or a
path to a ``config.json`` (or a folder holding one). ``model_overrides``
replaces top-level config fields (e.g. fewer layers, for speed; a test
checks that the shipped overrides leave the resolved geometry unchanged).
``platform`` is where vLLM would run (``cuda``, the default, or ``cpu``);
``device`` names the GPU whose answers kvspec gives to vLLM's hardware
queries (``cuda`` only; see ``DEVICES``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from ground.engines import DEFAULT_FAMILY, FAMILIES, load
from ground.errors import InvalidArgument, invalid
from reference.model_config import check_model_config
from reference.vllm_flags import check_vllm_args

PLATFORMS = ("cuda", "cpu")
#: The engine families a deployment may name (``engine``; vLLM by default):
#: the registry's (``ground.engines.FAMILIES``).
ENGINES = tuple(FAMILIES)
#: GPUs kvspec can answer vLLM's hardware queries for: compute capability.
DEVICES = {"a100": (8, 0), "h100": (9, 0), "h200": (9, 0), "b200": (10, 0)}
DEFAULT_DEVICE = "h100"
MAX_VLLM_ARGS = 64
MAX_ARG_CHARS = 4096
MAX_OVERRIDES = 64
_MODEL_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: Flags of a server command line that are no cache setting: the model
#: comes from ``model``; the rest start or describe a server. (A deployment
#: refuses them with every flag outside ``reference.vllm_flags.FLAGS``.)
RESERVED_FLAGS = ("--model", "--host", "--port", "--api-key", "--served-model-name")


@dataclass(frozen=True)
class Deployment:
    model: str
    vllm_args: tuple[str, ...] = ()
    model_overrides: dict[str, Any] = field(default_factory=dict)
    platform: str = "cuda"
    device: str | None = DEFAULT_DEVICE
    #: The engine family the flags are for (``ground.engines.FAMILIES``).
    engine: str = DEFAULT_FAMILY
    #: Another family's flags, held in the deployment field its registry
    #: entry names (``args_field``: SGLang's ``sglang_args``).
    family_args: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        out = {
            "model": self.model,
            "model_overrides": dict(self.model_overrides),
            "vllm_args": list(self.vllm_args),
            "platform": self.platform,
            "device": self.device,
        }
        if self.engine != DEFAULT_FAMILY:  # the default family's form (and cache key) is as it was
            del out["vllm_args"]
            out.update({"engine": self.engine, FAMILIES[self.engine].args_field: list(self.family_args)})
        return out

    @property
    def args(self) -> tuple[str, ...]:
        """The serve flags of the deployment's engine."""
        return self.vllm_args if self.engine == DEFAULT_FAMILY else self.family_args

    @property
    def sglang_args(self) -> tuple[str, ...]:
        """SGLang's flags (``family_args`` of an SGLang deployment), else ()."""
        return self.family_args if FAMILIES[self.engine].args_field == "sglang_args" else ()

    def key(self) -> str:
        """A canonical text of the deployment (a cache key)."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        """One line: model, flags, platform."""
        args = " ".join(self.args)
        over = f" {self.model_overrides}" if self.model_overrides else ""
        where = self.platform + (f"/{self.device}" if self.device else "")
        engine = "" if self.engine == DEFAULT_FAMILY else f"{self.engine}: "
        return f"{engine}{self.model}{over} [{where}] {args}".rstrip()


def _override_value(key: str, value: Any, depth: int = 0) -> Any:
    where = f"deployment.model_overrides.{key}"
    if depth > 4:
        raise invalid(
            where, "...", "nesting deeper than 4 levels; allowed: JSON scalars, lists and objects up to 4 levels"
        )
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str) and len(value) > MAX_ARG_CHARS:
            raise invalid(where, value[:40] + "...", f"a string of at most {MAX_ARG_CHARS} characters")
        return value
    if isinstance(value, int):
        if abs(value) > 2**31:
            raise invalid(where, value, "an integer of magnitude at most 2**31")
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise invalid(where, value, "a finite number")
        return value
    if isinstance(value, list):
        if len(value) > 4096:
            raise invalid(where, f"<list of {len(value)}>", "a list of at most 4096 items")
        return [_override_value(key, v, depth + 1) for v in value]
    if isinstance(value, dict):
        if len(value) > MAX_OVERRIDES:
            raise invalid(where, f"<object of {len(value)}>", f"an object of at most {MAX_OVERRIDES} fields")
        return {str(k): _override_value(f"{key}.{k}", v, depth + 1) for k, v in value.items()}
    raise invalid(where, value, "a JSON value")


def parse_deployment(raw: Any) -> Deployment:
    """Validate the ``deployment`` block of a case (shape only)."""
    if not isinstance(raw, dict):
        raise invalid(
            "deployment", raw, "must be a JSON object with model, vllm_args, model_overrides, platform, device"
        )
    allowed = (
        "model",
        "model_overrides",
        "vllm_args",
        "platform",
        "device",
        "engine",
        *(f.args_field for f in FAMILIES.values() if f.name != DEFAULT_FAMILY),
    )
    for key in raw:
        if key not in allowed:
            raise invalid(f"deployment.{key}", raw[key], f"unknown field; allowed: {', '.join(allowed)}")
    if "model" not in raw:
        raise InvalidArgument("deployment.model: missing; required field (a shipped model name or a config.json path)")
    model = raw["model"]
    if (
        not isinstance(model, str)
        or not model.strip()
        or len(model) > 1024
        or any(unicodedata.category(c) in ("Cc", "Cf") for c in model)
    ):
        raise invalid(
            "deployment.model",
            model,
            "a shipped model name (kvspec resolve --models lists them) or a path to a config.json",
        )
    if "/" not in model and not model.endswith(".json") and not _MODEL_NAME.match(model):
        raise invalid("deployment.model", model, "a shipped model name of [a-z0-9_] or a path to a config.json")
    args = raw.get("vllm_args", [])
    if not isinstance(args, list) or len(args) > MAX_VLLM_ARGS:
        raise invalid(
            "deployment.vllm_args", args, f"a list of at most {MAX_VLLM_ARGS} strings, as given to `vllm serve`"
        )
    for i, a in enumerate(args):
        if not isinstance(a, str) or len(a) > MAX_ARG_CHARS or "\0" in a:
            raise invalid(f"deployment.vllm_args[{i}]", a, f"a string of at most {MAX_ARG_CHARS} characters")
    check_vllm_args(args)
    engine = raw.get("engine", DEFAULT_FAMILY)
    if not isinstance(engine, str) or engine not in FAMILIES:  # the registry as it stands
        raise invalid("deployment.engine", engine, f"allowed: {', '.join(FAMILIES)}")
    family = FAMILIES[engine]
    family_args = raw.get(family.args_field, []) if engine != DEFAULT_FAMILY else []
    if engine != DEFAULT_FAMILY:
        if args:
            raise invalid(
                "deployment.vllm_args",
                args,
                f"with engine {engine} the flags are {family.args_field}; allowed: absent or []",
            )
        load(family.flags)(family_args)
    for other in FAMILIES.values():
        if other.name not in (DEFAULT_FAMILY, engine) and raw.get(other.args_field):
            raise invalid(
                f"deployment.{other.args_field}",
                raw[other.args_field],
                f'only with "engine": "{other.name}"; allowed: absent or []',
            )
    overrides = raw.get("model_overrides", {})
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict) or len(overrides) > MAX_OVERRIDES:
        raise invalid("deployment.model_overrides", overrides, f"an object of at most {MAX_OVERRIDES} config fields")
    clean = {}
    for key, value in overrides.items():
        if not _OVERRIDE_KEY.match(str(key)):
            raise invalid(f"deployment.model_overrides.{key}", value, "a config field name of [A-Za-z0-9_]")
        clean[key] = _override_value(key, value)
    check_model_config(clean, "deployment.model_overrides")
    platform = raw.get("platform", family.platforms[0])  # the family's first platform (CUDA, else llama.cpp's CPU)
    if platform not in PLATFORMS:
        raise invalid("deployment.platform", platform, f"allowed: {', '.join(PLATFORMS)}")
    device = raw.get("device", DEFAULT_DEVICE if platform == "cuda" else None)
    if platform == "cuda":
        if device not in DEVICES:
            raise invalid("deployment.device", device, f"allowed with platform cuda: {', '.join(DEVICES)}")
    elif device is not None:
        raise invalid("deployment.device", device, "only with platform cuda; allowed: null")
    if platform not in family.platforms:
        raise invalid(
            "deployment.platform",
            platform,
            f"with engine {engine}: {family.title}'s cache is resolved on these platforms only; allowed: {', '.join(family.platforms)}",
        )
    return Deployment(model.strip(), tuple(args), clean, platform, device, engine, tuple(family_args))


# ------------------------------------------------------------- flag edits


def _flag_positions(args: tuple[str, ...], flag: str) -> list[int]:
    return [i for i, a in enumerate(args) if a == flag or a.startswith(flag + "=")]


def get_flag(args: tuple[str, ...], flag: str) -> str | None:
    """The value of the last ``flag`` in ``args`` (``--f v`` or ``--f=v``)."""
    value = None
    for i in _flag_positions(args, flag):
        a = args[i]
        if "=" in a:
            value = a.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def drop_flag(args: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """``args`` without ``flag`` and its value."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return tuple(out)


def set_flag(args: tuple[str, ...], flag: str, value: str | None) -> tuple[str, ...]:
    """``args`` with ``flag`` set to ``value`` (dropped when None)."""
    rest = drop_flag(args, flag)
    return rest if value is None else (*rest, flag, value)
