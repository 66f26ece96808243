"""Stand-in model layers, so vLLM's own block-size alignment and KV-cache
spec code run without building a model.

In a vLLM worker the model's layers register in the static forward context;
``Platform.update_block_size_for_backend`` then reads each layer's attention
backend and (0.33.0) Mamba prefill-checkpoint alignment, and the model runner
collects each layer's ``get_kv_cache_spec``. kvspec registers one stand-in per
layer instead (the technique vLLM's own ``tests/v1/worker/
test_gpu_model_runner.py`` uses):

* :class:`AttentionStandIn` answers the backend the platform would pick and a
  ``FullAttentionSpec`` built as ``Attention.get_kv_cache_spec`` builds it for
  a plain decoder layer (the model config's KV heads for this tensor-parallel
  size, head size, the KV-cache dtype), passed through the backend's
  ``customize_spec``; draft (MTP) layers are flagged ``is_draft``.
* :class:`MambaStandIn` is a ``MambaBase``: vLLM's real
  ``MambaBase.get_kv_cache_spec`` runs, with the state shapes and dtypes from
  the model class's own ``get_mamba_state_shape_from_config`` /
  ``get_mamba_state_dtype_from_config``.

What a stand-in cannot ask vLLM is which Mamba layers export internal
prefill checkpoints; :data:`CHECKPOINT_EXPORTERS` states it per layer kind and
version (checked against vLLM's source by ``tests/engine/test_resolve.py``).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.models import ModelRegistry
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.kv_cache_interface import FullAttentionSpec

try:  # 0.32+
    from vllm.v1.kv_cache_interface import get_kv_quant_mode
except ImportError:  # pragma: no cover - older vLLM
    get_kv_quant_mode = None

try:
    from vllm.config.vllm import set_current_vllm_config
except ImportError:  # pragma: no cover
    from vllm.config import set_current_vllm_config

#: Which Mamba layer kinds export internal prefill checkpoints, from which
#: vLLM version, and what their spec then carries:
#:
#: * ``mamba2`` (``MambaMixer2.get_kv_cache_spec``, 0.32.0+, every device):
#:   one checkpoint block, alignment 1 (no block-size effect);
#: * ``gdn`` (``QwenGatedDeltaNetAttention``, 0.33.0, only with the FlashInfer
#:   GDN prefill kernel in align mode): layer alignment
#:   ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`` (64), spec alignment
#:   ``get_mamba_prefill_checkpoint_grid``.
CHECKPOINT_EXPORTERS = {"mamba2": (0, 32, 0), "gdn": (0, 33, 0)}


def _fields(cls) -> set[str]:
    try:
        return {f.name for f in fields(cls)}
    except TypeError:
        return set()


class AttentionStandIn(AttentionLayerBase):
    """A plain decoder full-attention layer."""

    def __init__(self, backend: type, is_draft: bool = False) -> None:
        self.backend = backend
        self.is_draft_layer = is_draft

    def get_attn_backend(self):
        return self.backend

    def get_kv_cache_spec(self, vllm_config):
        mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
        dtype = mc.dtype if cc.cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cc.cache_dtype]
        kwargs: dict[str, Any] = {
            "block_size": cc.block_size,
            "num_kv_heads": mc.get_num_kv_heads(pc),
            "head_size": mc.get_head_size(),
            "dtype": dtype,
        }
        if get_kv_quant_mode is not None and "kv_quant_mode" in _fields(FullAttentionSpec):
            kwargs["kv_quant_mode"] = get_kv_quant_mode(cc.cache_dtype)
        spec = FullAttentionSpec(**kwargs)
        customize = getattr(self.backend, "customize_spec", None)
        if customize is not None:
            with set_current_vllm_config(vllm_config):
                spec = customize(spec)
        if self.is_draft_layer and "is_draft" in _fields(type(spec)):
            spec = replace(spec, is_draft=True)
        return spec


class MambaStandIn(MambaBase):
    """A Mamba-like layer of the deployment's model class."""

    def __init__(self, vllm_config, mamba_type, checkpoint_alignment: int | None = None, spec_extra=None) -> None:
        self._vc = vllm_config
        self._cls, _ = ModelRegistry.resolve_model_cls(
            vllm_config.model_config.architecture, model_config=vllm_config.model_config
        )
        self._mamba_type = mamba_type
        self._alignment = checkpoint_alignment
        self._extra = spec_extra

    def get_state_shape(self):
        return self._cls.get_mamba_state_shape_from_config(self._vc)

    def get_state_dtype(self):
        return self._cls.get_mamba_state_dtype_from_config(self._vc)

    @property
    def mamba_type(self):
        return self._mamba_type

    def get_prefill_checkpoint_alignment(self):  # read by vLLM 0.33.0 only
        return self._alignment

    def get_kv_cache_spec(self, vllm_config):
        spec = super().get_kv_cache_spec(vllm_config)
        extra = self._extra(vllm_config) if callable(self._extra) else self._extra
        return replace(spec, **extra) if extra else spec


def kv_cache_specs(vllm_config) -> dict:
    """``{layer name: KVCacheSpec}`` of the registered stand-ins, in order."""
    out = {}
    for name, layer in vllm_config.compilation_config.static_forward_context.items():
        if isinstance(layer, (AttentionStandIn, MambaStandIn)):
            spec = layer.get_kv_cache_spec(vllm_config)
            if spec is not None:
                out[name] = spec
    return out
