"""Feasibility probe: drive SGLang 0.5.23's UnifiedRadixCache (FULL + MAMBA) in-process on CPU.

usage: venv/bin/python probe.py [--backend python|rust] [--strategy no_buffer|extra_buffer]
                                [--page-size N] [--eagle]
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubs  # noqa: F401  (torchvision stub)

from array import array

import torch

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.environ import envs
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

ap = argparse.ArgumentParser()
ap.add_argument("--backend", default="python")
ap.add_argument("--strategy", default="no_buffer")
ap.add_argument("--page-size", type=int, default=None)
ap.add_argument("--chunk", type=int, default=64, help="mamba cache chunk size (FLA chunk = 64)")
ap.add_argument("--eagle", action="store_true")
ap.add_argument("--prompt-len", type=int, default=3300)
args = ap.parse_args()

extra_buffer = args.strategy == "extra_buffer"
page_size = args.page_size or (64 if extra_buffer else 1)
N = args.prompt_len
KV = 16384
DEV = "cpu"

# --- server args: the cache reads global server args (mamba chunk size, max states/path)
server_args = ServerArgs(model_path="dummy", page_size=page_size)
server_args._mamba_cache_chunk_size = max(args.chunk, page_size)
set_global_server_args_for_scheduler(server_args)

# --- pools: hybrid req->token pool owning the mamba pool, KV pool for full-attn layers
num_layers, full_ids = 4, (3,)
mamba_ids = [i for i in range(num_layers) if i not in full_ids]
with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1,
                                    num_heads=2, head_dim=16, state_size=16, conv_kernel=4)
    cache_params = Mamba2CacheParams(shape=shape, layers=mamba_ids)
req_pool = HybridReqToTokenPool(size=8, mamba_size=16, mamba_spec_state_size=8,
                                max_context_len=8192, device=DEV, enable_memory_saver=False,
                                cache_params=cache_params, mamba_layer_ids=mamba_ids,
                                enable_mamba_extra_buffer=extra_buffer,
                                speculative_num_draft_tokens=3)
kv_pool = HybridLinearKVPool(size=KV, dtype=torch.bfloat16, page_size=page_size, head_num=1,
                             head_dim=8, full_attention_layer_ids=list(full_ids), device=DEV,
                             enable_memory_saver=False, mamba_pool=req_pool.mamba_pool)
allocator = TokenToKVPoolAllocator(size=KV, dtype=torch.bfloat16, device=DEV, kvcache=kv_pool,
                                   need_sort=False)
params = CacheInitParams(
    req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator, page_size=page_size,
    disable=False, tree_components=(ComponentType.FULL, ComponentType.MAMBA),
    enable_mamba_extra_buffer=extra_buffer, eviction_policy="lru", is_eagle=args.eagle,
    tree_core_backend=args.backend,
)
cache = UnifiedRadixCache(params=params)
print(f"backend requested={args.backend} selected={cache._tree_core_backend} "
      f"tree_core={type(cache.tree_core).__name__} strategy={args.strategy} page_size={page_size} "
      f"mamba_chunk={server_args._mamba_cache_chunk_size} eagle={args.eagle}")

_rid = [0]


def new_req(tokens=()):
    r = Req(rid=f"r{_rid[0]}", origin_input_text="", origin_input_ids=array("q", tokens),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    _rid[0] += 1
    req_pool.alloc([r])
    return r


def insert(tokens):
    """Insert a finished sequence with a Mamba state at its end (what cache_finished_req does)."""
    value = allocator.alloc(len(tokens))
    r = new_req()
    res = cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value,
                                    mamba_value=r.kv.mamba_pool_idx.unsqueeze(0)))
    return res


def match(tokens, limit):
    res = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), limit=limit)))
    mamba_val = cache.tree_core.get_component_device_value(res.best_match_node, ComponentType.MAMBA)
    return res, mamba_val


def show(label, tokens, limit):
    res, mv = match(tokens, limit)
    print(f"  {label:<34} len={len(tokens):5d} limit={limit!s:5} -> device_prefix_len(full+mamba)="
          f"{res.device_prefix_len:5d} full_kv_hit_length={res.full_kv_hit_length:5d} "
          f"mamba_state_at_match={'yes' if mv is not None else 'no'} "
          f"mamba_branching_seqlen={res.mamba_branching_seqlen}")
    return res


prompt = list(range(1000, 1000 + N))
sibling = prompt + list(range(50000, 50200))
ires = insert(prompt)
print(f"inserted {N}-token prompt with Mamba state at its end: {ires}")
print("match_prefix (low-level, RadixKey.limit = the scheduler's N-1 cap):")
show("resend identical, no cap", prompt, None)
show("resend identical, cap N-1", prompt, N - 1)
show("longer sibling (+200), cap len-1", sibling, len(sibling) - 1)
show("resend identical again, cap N-1", prompt, N - 1)

print("scheduler path: Req.init_next_round_input(tree_cache) (applies _compute_max_prefix_len):")
for label, toks in (("resend identical", prompt), ("longer sibling (+200)", sibling)):
    r = Req(rid=f"sched{label}", origin_input_text="", origin_input_ids=array("q", toks),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    req_pool.alloc([r])
    r.init_next_round_input(cache)
    print(f"  {label:<34} len={len(toks):5d} -> req.prefix_len={r.prefix_len} "
          f"num_matched_prefix_tokens={r.num_matched_prefix_tokens} "
          f"mamba_branching_seqlen={r.mamba_branching_seqlen} "
          f"cow_src={getattr(r.kv, 'mamba_cow_src_index', None)}")
    # release the lock taken by the match, if any
print("tree:")
try:
    cache.pretty_print()
except Exception as e:  # noqa: BLE001
    print("  pretty_print failed:", type(e).__name__, e)
