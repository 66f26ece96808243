"""What a deployment's model config may hold: no code, bounded sizes.

A deployment's model config (``deployment.model_overrides``, and the user's
``config.json`` when ``deployment.model`` is a path) goes to vLLM's config
loader inside a shared engine process. Rules, checked before vLLM is
called, at every nesting level (``text_config`` and the like):

* **No code.** A key that names code to import is refused: ``auto_map``,
  ``trust_remote_code``, ``custom_pipelines``, any key containing
  ``module`` or ``qualname``, any key with a word ``class``, ``classes`` or
  ``cls`` (``tokenizer_class``, ``worker_cls``; not ``classifier_dropout``)
  (:func:`loads_code`). kvspec resolves with vLLM's own model classes, never
  a model's code; it never needs a tokenizer or processor class.
* **Known architecture.** ``architectures``, where given, is a list of 1 to
  8 class names of ``[A-Za-z0-9_]``; that its first entry is one kvspec
  knows is checked against ``engine_adapter.models.served.MAMBA_KIND`` on the
  merged config, before vLLM sees it.
* **Bounded sizes.** A layer count (:data:`LAYER_FIELDS`) is at most
  :data:`MAX_LAYERS` = 1,024, and so is the length of a per-layer list
  (:data:`LAYER_LISTS`: ``layer_types``, ``layers_block_type``,
  ``hybrid_override_pattern``); a dimension (a field named like
  ``hidden_size``, ``head_dim``, ``num_attention_heads``,
  ``linear_num_value_heads``, ``mamba_d_state``, ``n_groups``, ``expand``:
  :func:`is_dimension`) is at most :data:`MAX_DIMENSION` = 1,048,576 (the
  longest prompt); any other integer at most :data:`MAX_CONFIG_INT` = 2**31.
  Real hybrid models have tens of layers and dimensions of thousands; vLLM's
  work (a stand-in layer per layer) grows with these numbers.

Every refusal is one line naming the field (``where.key``).
"""

from __future__ import annotations

import re
from typing import Any

from ground.errors import invalid

MAX_LAYERS = 1024
MAX_DIMENSION = 1 << 20
MAX_CONFIG_INT = 1 << 31
MAX_DEPTH = 8
MAX_ARCHITECTURES = 8
#: Fields that count decoder (or draft) layers.
LAYER_FIELDS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "n_predict",
)
#: Fields that hold one entry per layer.
LAYER_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "layers_num_experts")
#: Keys that name code to import.
CODE_KEYS = ("auto_map", "trust_remote_code", "custom_pipelines")
_CODE_SUBSTRINGS = ("module", "qualname", "auto_map", "automap")
_CODE_WORDS = ("class", "classes", "cls")
_DIMENSION = re.compile(r"(^|_)(size|dim|dims|heads|state|rank|groups|group|kernel|expand|ssm|conv|head|experts)$")
_NOT_DIMENSION = ("vocab_size", "max_position_embeddings")
_ARCH_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")


def loads_code(key: str) -> bool:
    """Whether a config key names code to import (see the module rules)."""
    k = key.lower()
    words = re.split(r"[^a-z0-9]+", k)
    return k in CODE_KEYS or any(part in k for part in _CODE_SUBSTRINGS) or any(w in _CODE_WORDS for w in words)


def is_dimension(key: str) -> bool:
    """Whether a config key is a dimension (a size, head count, state size)."""
    return key not in _NOT_DIMENSION and bool(_DIMENSION.search(key.lower()))


def check_model_config(cfg: dict, where: str, depth: int = 0) -> None:
    """Refuse code-loading keys and out-of-bound sizes in ``cfg`` (one line
    naming ``where.key``); nested objects are checked the same way."""
    if depth > MAX_DEPTH:
        raise invalid(where, "...", f"nesting deeper than {MAX_DEPTH} levels; allowed: a model config")
    for key, value in cfg.items():
        key = str(key)
        field = f"{where}.{key}"
        if loads_code(key):
            raise invalid(
                field,
                value,
                "names code to import (kvspec uses vLLM's own model classes, never a model's code); allowed: remove the field",
            )
        if key == "architectures":
            _check_architectures(field, value)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            top = MAX_LAYERS if key in LAYER_FIELDS else MAX_DIMENSION if is_dimension(key) else MAX_CONFIG_INT
            if abs(value) > top:
                what = "layers" if key in LAYER_FIELDS else "a dimension" if is_dimension(key) else "an integer"
                raise invalid(field, value, f"{what} of at most {top:,} (kvspec's documented model config limits)")
        elif isinstance(value, (list, str)) and key in LAYER_LISTS and len(value) > MAX_LAYERS:
            raise invalid(field, f"<{len(value)} entries>", f"one entry per layer, at most {MAX_LAYERS:,} layers")
        elif isinstance(value, dict):
            check_model_config(value, field, depth + 1)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    check_model_config(item, f"{field}[{i}]", depth + 1)


def _check_architectures(field: str, value: Any) -> None:
    if not (
        isinstance(value, list)
        and 1 <= len(value) <= MAX_ARCHITECTURES
        and all(isinstance(a, str) and _ARCH_NAME.match(a) for a in value)
    ):
        raise invalid(field, value, f"a list of 1 to {MAX_ARCHITECTURES} architecture class names of [A-Za-z0-9_]")
