#!/bin/bash
# For each installed top-level module, check whether probe.py's imports still succeed with it stubbed.
cd /tmp/s37/sglang
IMPORTS="import stubs
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.configs.mamba_utils import Mamba2CacheParams
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs"
for m in triton orjson psutil pybase64 requests PIL starlette msgspec pydantic zmq tqdm IPython aiohttp transformers dill tvm_ffi sentencepiece compressed_tensors gguf openai partial_json_parser datasets; do
  if PROBE_EXTRA_STUBS=$m ./venv/bin/python -W ignore -c "$IMPORTS" >/dev/null 2>&1; then echo "$m: stubbable (not needed for the import)"; else echo "$m: REQUIRED"; fi
done
