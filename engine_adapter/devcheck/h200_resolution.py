"""Cross-check kvspec's GPU stand-in against vLLM's real platform on an H200.

kvspec resolves ``cuda`` deployments on a CPU-only machine: vLLM's neutral
``UnspecifiedPlatform`` answers the hardware questions for a named GPU
(``engine_adapter.vllm_engine.platform``, ``KVSPEC_PLATFORM=cuda``, device ``h200``). This
script runs on a machine with one real NVIDIA H200 and lets vLLM detect its
platform itself (``KVSPEC_PLATFORM=native``: kvspec installs nothing and
``vllm.platforms.current_platform`` is vLLM's ``CudaPlatform``, NVML-backed).
It records that platform's answers to the questions the stand-in answers
(capability, device name, memory, CUDA runtime, fp8, hybrid KV cache, graph
mode) and the attention backend vLLM's selector picks for each deployment,
resolves the same deployments with ``engine_adapter.vllm_engine.resolve`` under both
platforms, and compares every field of the resolution summaries (geometry,
speculative settings, facts). ``--reference`` adds a comparison with the
stand-in as kvspec runs it on its own CPU machine (``--child standin`` in
the engine environment, ``environments.worker_env``).

It lives under ``engine_adapter/`` because it imports vLLM; it is not part of
``make test`` or ``make check`` (it needs the GPU). Result and procedure:
``docs/deployments.md``, "Checked on a real H200", and
``docs/data/h200-resolution.json``.

It is one file of about 670 lines (over 500 lines) on purpose: a one-off check, run on a
borrowed GPU machine with its result kept in ``docs/data/``, whose parts
(the stubs, the child that questions a platform, the comparison) serve only
that run; split, they would be modules nothing else imports.

The GPU machine's image has torch (2.11, CUDA 13.0), transformers and triton
but no vLLM, and no network. What travels: vLLM 0.33.0's package tree
from kvspec's engine environment without its compiled extensions (``*.so``,
the ``vllm-rs`` binary, ``third_party/deep_gemm`` and ``fmha_sm100``), as a
tar.xz, and cp312 wheels of the pure-Python-or-small dependencies the image
lacks (pydantic, msgspec, cbor2, pyzmq, ...: found by importing, in a
py3.11 environment holding the image's torch/transformers/triton versions).
vLLM's kernels cannot travel (hundreds of MiB) and are not needed for the
questions asked; :data:`STUBS` lists the three compiled modules the CUDA
path imports unconditionally, replaced by ``.py`` stubs written into the
tree with ``--make-stubs`` (each says ``KVSPEC_STUB``; the result records
them under ``kernels``).

A one-GPU machine makes vLLM refuse a tensor parallel size above 1 under
the real platform (world size larger than the node's GPUs). The native run
records that refusal (``refused_on_this_node``), then resolves the
deployment again with only ``CudaPlatform.device_count`` answered as 8 (an
8-GPU H200 node), noted per row as ``device_count_override``.

Usage (the repository root and vLLM on ``PYTHONPATH``)::

    python -m engine_adapter.devcheck.h200_resolution --out DIR [--tp 1,2,4,8] \
        [--models qwen3_next,...] [--modes native,standin] [--reference FILE]

runs one child process per mode and model (``--child MODE``), ``--jobs`` at
a time, and writes ``DIR/h200-resolution.json`` (children's JSON and logs
beside it). How it was run (2026-11-30). Here, from the repository root, with
``/.devcheck/`` in ``.git/info/exclude``: copy
``.kvspec/engines/vllm-0.33.0/lib/python3.11/site-packages/{vllm,
vllm-0.33.0.dist-info}`` without ``*.so``, ``__pycache__``, ``vllm/vllm-rs``,
``vllm/third_party/{deep_gemm,fmha_sm100}`` to ``.devcheck/local/site``; run
``--make-stubs .devcheck/local/site/vllm``; ``tar -cJf
.devcheck/carry/vllm-0.33.0-py.tar.xz`` of that folder; ``pip download``
(``--python-version 3.12``, manylinux) the 22 wheels named in
``.devcheck/carry/specs.txt`` into ``.devcheck/carry/whl``; write the
reference with ``--child standin --tp 1,2,4,8 --json
.devcheck/carry/reference-standin.json`` in the engine environment under
``environments.worker_env("0.33.0", "cuda")``. On the GPU machine, carrying
``.devcheck/carry``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .devcheck/carry/whl/*.whl
    tar -C /tmp/site -xJf .devcheck/carry/vllm-0.33.0-py.tar.xz
    PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 python3 -m engine_adapter.devcheck.h200_resolution \
        --out /tmp/dc --modes native,standin --tp 1,2,4,8 --jobs 15 \
        --reference .devcheck/carry/reference-standin.json

(165 s there: 14 children at once, each 2-3 minutes, mostly vLLM's
model-class inspection subprocesses). Then, here, ``--compact
h200-resolution.json --out docs/data/h200-resolution.json``.

``--child fakecuda`` is for a dry run on a machine without a
GPU: vLLM's ``CudaPlatform`` class with kvspec's H200 answers, triton's and
torch's device queries answered likewise, so the CUDA-only import paths run
(not their kernels).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

DEVICE = "h200"
#: Stand-ins for vLLM's compiled modules that the CUDA code path imports
#: unconditionally, written as ``.py`` files into the vLLM tree the check
#: runs (``--make-stubs``), so vLLM's own subprocesses (the model registry
#: inspects model classes in one) import them too. Each carries
#: ``KVSPEC_STUB = True``; the result records which modules were stubs.
#:
#: * ``vllm._C_stable_libtorch`` (89 MiB): ``platforms/cuda.py`` imports it
#:   at module top to register ops. The stub registers no op but answers the
#:   one capability query vLLM calls while importing its modules on CUDA
#:   (``w8a8_utils``: CUTLASS block-FP8 GEMM, true from SM90 on); it is not
#:   on the block-size path.
#: * ``vllm.vllm_flash_attn._vllm_fa2_C`` / ``_vllm_fa3_C`` (294 / 165 MiB):
#:   without either, ``vllm.vllm_flash_attn`` refuses to import, and with it
#:   ``fa_utils``, which ``FlashAttentionBackend`` imports on CUDA. A full
#:   install on an H200 has both; the stubs make FlashAttention count as
#:   installed. FA4 (the ``cute`` package, which needs the CUTLASS DSL) stays
#:   as the machine has it (absent), which on SM90 changes no kernel block
#:   size for these models (``fa_utils``: FA4's 64/128-token pages apply to
#:   head size 512 with an fp8 KV cache, or head size 256 on SM100/110).
STUBS = {
    "_C_stable_libtorch.py": '''"""kvspec devcheck stub for vLLM's compiled _C_stable_libtorch (not carried)."""
import torch

KVSPEC_STUB = True
QUERY_OPS = {"cutlass_scaled_mm_supports_block_fp8": lambda capability: capability >= 90}
for _name, _fn in QUERY_OPS.items():
    try:
        getattr(torch.ops._C, _name)
    except (AttributeError, RuntimeError):
        setattr(torch.ops._C, _name, _fn)
''',
    "vllm_flash_attn/_vllm_fa2_C.py": '"""kvspec devcheck stub for FlashAttention 2\'s extension (not carried)."""\nKVSPEC_STUB = True\n',
    "vllm_flash_attn/_vllm_fa3_C.py": '"""kvspec devcheck stub for FlashAttention 3\'s extension (not carried)."""\nKVSPEC_STUB = True\n',
}
TP_OVERRIDE_COUNT = 8
#: facts that may differ between two runs and say nothing about the geometry
IGNORED_FACTS = {"vllm_version"}


def _short(e: BaseException | str, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _try(fn):
    try:
        v = fn()
        if isinstance(v, tuple):
            v = list(v)
        if not isinstance(v, (int, float, str, bool, list, dict, type(None))):
            v = str(v)
        return v
    except Exception as e:  # noqa: BLE001 - recorded
        return {"error": f"{type(e).__name__}: {_short(e)}"}


def make_stubs(vllm_dir: Path) -> list[str]:
    """Write :data:`STUBS` into a vLLM package folder that lacks the
    compiled modules (never over a real one)."""
    written = []
    for rel, text in STUBS.items():
        target = vllm_dir / rel
        stem = target.name.removesuffix(".py")
        if any(target.parent.glob(stem + ".*so")):
            continue
        target.write_text(text)
        written.append(rel)
    return written


def _kernel_modules() -> list[dict]:
    """For each stubbable module: a stub or vLLM's compiled one."""
    out = []
    for rel in STUBS:
        name = "vllm." + rel.removesuffix(".py").replace("/", ".")
        try:
            m = importlib.import_module(name)
            out.append(
                {"module": name, "stub": bool(getattr(m, "KVSPEC_STUB", False)), "file": getattr(m, "__file__", None)}
            )
        except Exception as e:  # noqa: BLE001
            out.append({"module": name, "error": f"{type(e).__name__}: {_short(e)}"})
    return out


def _install_fakecuda() -> None:
    """Dry run only: vLLM's CudaPlatform with kvspec's H200 answers."""
    from vllm import platforms
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    from engine_adapter.vllm_engine import platform as kplatform

    cap, mem, name = kplatform.DEVICES[DEVICE]

    class FakeCuda(CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*cap)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return mem << 30

        @classmethod
        def device_count(cls) -> int:
            return 1

        @classmethod
        def is_fully_connected(cls, physical_device_ids) -> bool:
            return True

    platforms._current_platform = FakeCuda()


def _hardware(p) -> dict:
    q = {
        "platform_class": type(p).__name__,
        "device_capability": _try(lambda: [p.get_device_capability().major, p.get_device_capability().minor]),
        "device_name": _try(p.get_device_name),
        "total_memory_bytes": _try(p.get_device_total_memory),
        "cuda_runtime_major": _try(p.get_cuda_runtime_major),
        "is_cuda": _try(p.is_cuda),
        "is_cuda_alike": _try(p.is_cuda_alike),
        "is_device_capability_90": _try(lambda: p.is_device_capability(90)),
        "supports_fp8": _try(p.supports_fp8),
        "fp8_dtype": _try(p.fp8_dtype),
        "support_hybrid_kv_cache": _try(p.support_hybrid_kv_cache),
        "support_static_graph_mode": _try(p.support_static_graph_mode),
        "device_count": _try(p.device_count),
    }
    mem = q["total_memory_bytes"]
    if isinstance(mem, int):
        q["total_memory_gib"] = round(mem / (1 << 30), 3)
    return q


def _torch_facts() -> dict:
    import torch

    out = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": _try(torch.cuda.is_available),
    }
    if out["cuda_available"] is True:
        out["device_name"] = _try(lambda: torch.cuda.get_device_name(0))
        out["capability"] = _try(lambda: list(torch.cuda.get_device_capability(0)))
        out["total_memory_bytes"] = _try(lambda: torch.cuda.get_device_properties(0).total_memory)
        out["multiprocessors"] = _try(lambda: torch.cuda.get_device_properties(0).multi_processor_count)
    return out


def _third_party_modules() -> dict:
    """Top-level packages this process imported from outside the standard
    library, vLLM and this repository, with their versions (what a machine
    without vLLM must bring)."""
    import importlib.metadata as md

    here = Path(__file__).resolve().parents[2]
    std = set(getattr(sys, "stdlib_module_names", ()))
    out = {}
    for name in sorted({m.split(".")[0] for m in list(sys.modules)}):
        if name in std or name.startswith("_") or name in ("vllm", "engine_adapter", "kvspec", "reference"):
            continue
        f = getattr(sys.modules.get(name), "__file__", None) or ""
        if not f or (Path(f).resolve().is_relative_to(here) and "site-packages" not in f):
            continue
        dists = md.packages_distributions().get(name, [])
        out[name] = {"dist": dists, "version": _try(lambda d=dists: md.version(d[0])) if dists else None, "file": f}
    return out


def _deployments(tps: set[int], models: set[str] | None) -> list[dict]:
    from engine_adapter.models.table import table_deployments

    rows = [r for r in table_deployments(DEVICE) if r["tp"] in tps and (models is None or r["model"] in models)]
    return rows


def _selector(p, vc) -> dict:
    """What vLLM's attention selector picks on this platform for the
    deployment's attention layers, and why the others were refused."""
    from vllm.config.vllm import set_current_vllm_config
    from vllm.v1.attention.selector import AttentionSelectorConfig, get_attn_backend

    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    cfg = AttentionSelectorConfig(
        head_size=mc.get_head_size(), dtype=mc.dtype, kv_cache_dtype=cc.cache_dtype, block_size=None
    )
    num_heads = mc.get_num_attention_heads(pc)
    out: dict = {}
    with set_current_vllm_config(vc):
        try:
            valid, invalid = p.get_valid_backends(
                device_capability=p.get_device_capability(), attn_selector_config=cfg, num_heads=num_heads
            )
            out["valid"] = [c.backend.name for c in sorted(valid, key=lambda c: c.priority)]
            out["refused"] = {b.name: [_short(x, 240) for x in reasons] for b, (_, reasons) in invalid.items()}
            sizes = {}
            for c in valid:
                sizes[c.backend.name] = _try(
                    lambda c=c: [
                        getattr(s, "base", s) if not isinstance(s, int) else s
                        for s in c.backend_class.get_supported_kernel_block_sizes()
                    ]
                )
            out["kernel_block_sizes"] = sizes
        except Exception as e:  # noqa: BLE001
            out["valid_error"] = f"{type(e).__name__}: {_short(e)}"
        try:
            chosen = get_attn_backend(mc.get_head_size(), mc.dtype, cc.cache_dtype, num_heads=num_heads)
            out["chosen"] = chosen.get_name()
            out["chosen_class"] = f"{chosen.__module__}.{chosen.__qualname__}"
            out["_cls"] = chosen
        except Exception as e:  # noqa: BLE001
            out["chosen_error"] = f"{type(e).__name__}: {_short(e, 600)}"
    return out


def _resolve_row(row: dict, mode: str, p) -> dict:
    from engine_adapter.vllm_engine import resolve as R
    from ground.errors import KvspecError
    from reference.deployment import parse_deployment

    dep = parse_deployment(row["deployment"])
    entry: dict = {
        "model": row["model"],
        "tp": row["tp"],
        "kv_dtype": row["dtype"],
        "mtp": row["mtp"],
        "vllm_args": row["deployment"]["vllm_args"],
    }
    t0 = time.perf_counter()

    def once():
        res = R.resolve(dep)
        return res, R.summary(res)

    res = None
    try:
        res, summ = once()
        entry["summary"] = summ
    except KvspecError as e:
        msg = _short(e, 600)
        if e.__context__ is not None:  # vLLM's own exception, behind kvspec's one line
            entry["cause"] = "".join(traceback.format_exception(e.__context__))[-3000:]
        if mode != "standin" and "available GPUs" in msg:
            entry["refused_on_this_node"] = msg
            cls = type(p)
            before = cls.__dict__.get("device_count")
            cls.device_count = classmethod(lambda c: TP_OVERRIDE_COUNT)
            entry["device_count_override"] = TP_OVERRIDE_COUNT
            try:
                res, summ = once()
                entry["summary"] = summ
            except KvspecError as e2:
                entry["error"] = _short(e2, 600)
            finally:
                if before is None:
                    del cls.device_count
                else:
                    cls.device_count = before
        else:
            entry["error"] = msg
    except Exception as e:  # noqa: BLE001
        entry["error"] = f"{type(e).__name__}: {_short(e, 600)}"
        entry["traceback"] = traceback.format_exc()[-2000:]
    if res is not None and mode != "standin":
        sel = _selector(p, res.vllm_config)
        cls = sel.pop("_cls", None)
        entry["attention_selector"] = sel
        if cls is not None and sel.get("chosen") != R.ALIGNMENT_BACKEND:
            # the geometry vLLM would align with the selector's own pick
            orig = R._attention_backend
            R._attention_backend = lambda d: (cls, sel["chosen"])
            try:
                entry["summary_with_selected_backend"] = R.summary(R.resolve(dep))
            except Exception as e:  # noqa: BLE001
                entry["summary_with_selected_backend"] = {"error": f"{type(e).__name__}: {_short(e, 400)}"}
            finally:
                R._attention_backend = orig
    entry["seconds"] = round(time.perf_counter() - t0, 3)
    return entry


def child(mode: str, out_path: Path, tps: set[int], models: set[str] | None) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ["KVSPEC_PLATFORM"] = "native" if mode in ("native", "fakecuda") else "cuda"
    result: dict = {"mode": mode, "python": sys.version.split()[0]}
    t0 = time.perf_counter()
    from ground.home import contain_this_process

    contain_this_process()  # vLLM's caches under this child's KVSPEC_HOME, as an engine process
    from engine_adapter.vllm_engine import platform as kplatform

    if mode == "fakecuda":  # dry run: triton's CUDA driver is not active without a GPU
        try:
            from triton.backends import backends
            from triton.backends.compiler import GPUTarget
            from triton.runtime import driver

            drv = backends["nvidia"].driver
            (drv if isinstance(drv, type) else type(drv)).is_active = classmethod(lambda cls: True)

            class _FakeDriver:
                def get_current_target(self):
                    return GPUTarget("cuda", 90, 32)

                def get_current_device(self):
                    return 0

            driver.set_active(_FakeDriver())
            import torch

            props = types.SimpleNamespace(
                name="NVIDIA H200",
                major=9,
                minor=0,
                total_memory=141 << 30,
                multi_processor_count=132,
                L2_cache_size=60 << 20,
            )
            torch.cuda.get_device_name = lambda *a, **k: props.name
            torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
            torch.cuda.get_device_properties = lambda *a, **k: props
            torch.cuda.device_count = lambda: 1
            torch.cuda.current_device = lambda: 0
        except Exception as e:  # noqa: BLE001
            result["fake_triton_driver"] = _short(e)
    kplatform.install()
    import vllm

    result["vllm"] = vllm.__version__
    result["vllm_file"] = vllm.__file__
    if mode == "fakecuda":
        _install_fakecuda()
    kplatform.set_device(DEVICE)
    try:
        from vllm.platforms import current_platform as p

        result["hardware"] = _hardware(p)
    except Exception as e:  # noqa: BLE001
        result["platform_error"] = f"{type(e).__name__}: {_short(e, 800)}"
        result["traceback"] = traceback.format_exc()[-4000:]
        out_path.write_text(json.dumps(result, indent=1, default=str))
        return 2
    result["torch"] = _try(_torch_facts)
    result["kernels"] = _kernel_modules()
    result["import_seconds"] = round(time.perf_counter() - t0, 2)
    rows = []
    for row in _deployments(tps, models):
        rows.append(_resolve_row(row, mode, p))
        out_path.write_text(json.dumps({**result, "rows": rows}, indent=1, default=str))
        print(
            f"[{mode}] {row['model']} tp{row['tp']} {row['dtype']} mtp={row['mtp']}: "
            f"{(rows[-1].get('summary') or {}).get('geometry', {}).get('scheduler_block_size', rows[-1].get('error', '?'))} ({rows[-1]['seconds']} s)",
            flush=True,
        )
    result["rows"] = rows
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["third_party_modules"] = _third_party_modules()
    out_path.write_text(json.dumps(result, indent=1, default=str))
    return 0


# ------------------------------------------------------------------ compare


def _flat(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def _cell(s: dict | None) -> str | None:
    if not s:
        return None
    g, f = s["geometry"], s["facts"]
    return (
        f"{g['scheduler_block_size']}/{g['hash_block_size']}/{f.get('mamba_block_size')}/{f.get('cache_hit_alignment_tokens') or g['scheduler_block_size']}"
        + (f" ckpt {g['prefill_checkpoint_grid']}" if g.get("prefill_checkpoint_grid") else "")
    )


def compare(native: dict, standin: dict) -> dict:
    hw_keys = (
        "device_capability",
        "device_name",
        "total_memory_bytes",
        "cuda_runtime_major",
        "supports_fp8",
        "support_hybrid_kv_cache",
        "support_static_graph_mode",
        "is_device_capability_90",
    )
    nh, sh = native.get("hardware", {}), standin.get("hardware", {})
    hardware = {k: {"native": nh.get(k), "standin": sh.get(k), "same": nh.get(k) == sh.get(k)} for k in hw_keys}
    by_key = {(r["model"], r["tp"], r["kv_dtype"], r["mtp"]): r for r in standin.get("rows", [])}
    rows = []
    for r in native.get("rows", []):
        key = (r["model"], r["tp"], r["kv_dtype"], r["mtp"])
        s = by_key.get(key)
        if s is None:
            rows.append(
                {
                    "model": key[0],
                    "tp": key[1],
                    "kv_dtype": key[2],
                    "mtp": key[3],
                    "native": _cell(r.get("summary")) or f"error: {r.get('error')}",
                    "standin": "missing",
                    "agree": None,
                }
            )
            continue
        ns, ss = r.get("summary"), s.get("summary")
        item = {
            "model": key[0],
            "tp": key[1],
            "kv_dtype": key[2],
            "mtp": key[3],
            "native": _cell(ns) or f"error: {r.get('error')}",
            "standin": _cell(ss) or f"error: {s.get('error')}",
        }
        if r.get("device_count_override"):
            item["device_count_override"] = r["device_count_override"]
        if ns and ss:
            a = _flat(
                {
                    "geometry": ns["geometry"],
                    "speculative": ns["speculative"],
                    "facts": {k: v for k, v in ns["facts"].items() if k not in IGNORED_FACTS},
                }
            )
            b = _flat(
                {
                    "geometry": ss["geometry"],
                    "speculative": ss["speculative"],
                    "facts": {k: v for k, v in ss["facts"].items() if k not in IGNORED_FACTS},
                }
            )
            diff = {
                k: {"native": a.get(k), "standin": b.get(k)} for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
            }
            item["differences"] = diff
            item["agree"] = not diff
        else:
            item["agree"] = r.get("error") is not None and r.get("error") == s.get("error")
            item["errors"] = {"native": r.get("error"), "standin": s.get("error")}
        sel = r.get("attention_selector") or {}
        item["selector_chosen"] = sel.get("chosen") or sel.get("chosen_error")
        sws = r.get("summary_with_selected_backend")
        if isinstance(sws, dict) and "geometry" in sws:
            item["native_with_selected_backend"] = _cell(sws)
        rows.append(item)
    return {
        "hardware": hardware,
        "rows": rows,
        "agree_rows": sum(1 for x in rows if x["agree"]),
        "disagree_rows": sum(1 for x in rows if x["agree"] is False),
        "rows_total": len(rows),
        "missing_in_standin": sum(1 for x in rows if x["agree"] is None),
    }


def compact(results: dict) -> dict:
    """The result without what repeats: the first mode's rows with their
    geometry groups, facts and selector answer; the other modes' rows as
    cells; the comparisons' verdicts and differences. This is what
    ``docs/data/h200-resolution.json`` keeps."""

    def key(r: dict) -> dict:
        return {k: r[k] for k in ("model", "tp", "kv_dtype", "mtp") if k in r}

    def full_row(r: dict) -> dict:
        out = key(r)
        summ = r.get("summary")
        if summ:
            out["cell"] = _cell(summ)
            out["groups"] = summ["geometry"]["groups"]
            out["speculative"] = summ["speculative"]
            out["facts"] = summ["facts"]
        else:
            out["error"] = r.get("error")
        if r.get("refused_on_this_node"):
            out["refused_on_this_node"] = r["refused_on_this_node"]
            out["device_count_override"] = r.get("device_count_override")
        sel = r.get("attention_selector")
        if sel:
            out["attention_selector"] = {
                k: sel.get(k)
                for k in ("chosen", "valid", "refused", "kernel_block_sizes", "chosen_error")
                if sel.get(k) is not None
            }
        return out

    def cell_row(r: dict) -> dict:
        return {**key(r), "cell": _cell(r.get("summary")) or f"error: {r.get('error')}"}

    def verdicts(c: dict) -> dict:
        return {
            **{
                k: c[k]
                for k in ("hardware", "agree_rows", "disagree_rows", "rows_total", "missing_in_standin")
                if k in c
            },
            "rows": [
                {
                    k: v
                    for k, v in x.items()
                    if k in ("model", "tp", "kv_dtype", "mtp", "agree", "differences", "errors") and v not in ({}, None)
                }
                for x in c.get("rows", [])
            ],
        }

    out = {k: results[k] for k in ("checked_at_utc", "device", "tp", "models", "wall_seconds") if k in results}
    first = True
    for mode in ("native", "fakecuda", "standin"):
        m = results.get(mode)
        if not m:
            continue
        keep = {
            k: m[k]
            for k in ("vllm", "python", "hardware", "torch", "kernels", "import_seconds", "platform_error")
            if k in m
        }
        keep["children"] = [{k: c[k] for k in ("model", "rc", "seconds")} for c in m.get("children", [])]
        keep["third_party_modules"] = {k: v.get("version") for k, v in (m.get("third_party_modules") or {}).items()}
        keep["rows"] = [(full_row if first else cell_row)(r) for r in m.get("rows", [])]
        first = False
        out[mode] = keep
    ref = results.get("reference_standin")
    if ref:
        out["reference_standin"] = {
            "vllm_file": ref.get("vllm_file"),
            "hardware": ref.get("hardware"),
            "rows": [cell_row(r) for r in ref.get("rows", [])],
        }
    for name in ("comparison", "comparison_with_reference"):
        if name in results:
            out[name] = verdicts(results[name])
    return out


def dump_compact(out: dict) -> str:
    """JSON with two-level indentation and one line per row."""
    rows: list[str] = []

    def mark(o):
        if isinstance(o, dict):
            return {
                k: ([_token(rows, r) for r in v] if k == "rows" and isinstance(v, list) else mark(v))
                for k, v in o.items()
            }
        return o

    text = json.dumps(mark(out), indent=1, default=str)
    for i, r in enumerate(rows):
        text = text.replace(f'"@@row{i}@@"', r, 1)
    return text + "\n"


def _token(rows: list[str], r) -> str:
    rows.append(json.dumps(r, default=str))
    return f"@@row{len(rows) - 1}@@"


def _run_children(modes: list[str], models: list[str], a, home: Path) -> dict:
    """One child per (mode, model), ``a.jobs`` at a time; rows merged per mode."""
    jobs = [(m, model) for m in modes for model in models]
    running: list = []
    done: dict = {m: {"rows": [], "children": []} for m in modes}

    def start(mode, model):
        path = a.out / f"child-{mode}-{model}.json"
        env = dict(os.environ, KVSPEC_HOME=str(home / f"{mode}-{model}"), PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable,
            "-m",
            "engine_adapter.devcheck.h200_resolution",
            "--child",
            mode,
            "--json",
            str(path),
            "--tp",
            a.tp,
            "--models",
            model,
        ]
        log = open(a.out / f"child-{mode}-{model}.log", "w")  # noqa: SIM115 - open while the child runs
        return (
            mode,
            model,
            path,
            log,
            time.perf_counter(),
            subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
        )

    def finish(item, rc):
        mode, model, path, log, t0, _ = item
        log.close()
        data = json.loads(path.read_text()) if path.is_file() else {}
        info = {"model": model, "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
        if rc != 0:
            info["log_tail"] = (a.out / f"child-{mode}-{model}.log").read_text(errors="replace")[-3000:]
        done[mode]["children"].append(info)
        done[mode]["rows"].extend(data.pop("rows", []))
        for k, v in data.items():
            if k == "third_party_modules":
                done[mode].setdefault(k, {}).update(v)
            else:
                done[mode].setdefault(k, v)
        print(f"--- child {mode} {model}: rc={rc} in {info['seconds']} s", flush=True)
        if rc != 0:
            print(info["log_tail"][-1500:], flush=True)

    while jobs or running:
        while jobs and len(running) < a.jobs:
            running.append(start(*jobs.pop(0)))
        time.sleep(0.5)
        for item in list(running):
            rc = item[5].poll()
            if rc is None and time.perf_counter() - item[4] > a.child_timeout:
                item[5].kill()
                rc = "timeout"
            if rc is not None:
                running.remove(item)
                finish(item, rc)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=("native", "standin", "fakecuda"))
    ap.add_argument("--json", type=Path, help="with --child: where it writes")
    ap.add_argument(
        "--make-stubs", type=Path, metavar="VLLM_DIR", help="write the stub modules into a vLLM package folder and exit"
    )
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--models", default=None, help="comma list of shipped models (default all)")
    ap.add_argument("--modes", default="native,standin", help="children the parent runs")
    ap.add_argument("--jobs", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--child-timeout", type=float, default=300.0, help="seconds for one child")
    ap.add_argument(
        "--compact", type=Path, metavar="FULL_JSON", help="write compact(FULL_JSON) to --out (a file) and exit"
    )
    ap.add_argument(
        "--reference",
        type=Path,
        help="a stand-in result computed elsewhere (kvspec's own CPU machine): compared with the first mode too",
    )
    a = ap.parse_args(argv)
    if a.compact:
        a.out.write_text(dump_compact(compact(json.loads(a.compact.read_text()))))
        return 0
    if a.make_stubs:
        print(json.dumps(make_stubs(a.make_stubs)))
        return 0
    tps = {int(x) for x in a.tp.split(",")}
    if a.child:
        return child(a.child, a.json, tps, set(a.models.split(",")) if a.models else None)
    from engine_adapter.models import SHIPPED

    models = a.models.split(",") if a.models else list(SHIPPED)
    a.out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="kvspec-devcheck-"))
    modes = a.modes.split(",")
    t0 = time.perf_counter()
    results: dict = {
        "checked_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": DEVICE,
        "tp": sorted(tps),
        "models": models,
    }
    results.update(_run_children(modes, models, a, home))
    results["wall_seconds"] = round(time.perf_counter() - t0, 1)
    first = modes[0]
    if "standin" in results and first != "standin":
        results["comparison"] = compare(results[first], results["standin"])
    if a.reference and a.reference.is_file():
        ref = json.loads(a.reference.read_text())
        ref = ref.get("standin", ref)
        results["reference_standin"] = {k: v for k, v in ref.items() if k != "rows"} | {"rows": ref.get("rows", [])}
        results["comparison_with_reference"] = compare(results[first], ref)
    out = a.out / "h200-resolution.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    for name in ("comparison", "comparison_with_reference"):
        cmp_ = results.get(name)
        if not cmp_:
            continue
        print(f"== {name}")
        print(json.dumps({k: v for k, v in cmp_["hardware"].items() if not v["same"]}, indent=1))
        for r in cmp_["rows"]:
            print(
                f"{r['model']:16} tp{r['tp']} {r['kv_dtype']:4} mtp={r['mtp']!s:5} {first}={str(r['native'])[:60]:34} standin={str(r['standin'])[:60]:34} agree={r['agree']} sel={r.get('selector_chosen')}"
                + (f" diff={r.get('differences')}" if r.get("differences") else "")
            )
        print(f"agree: {cmp_['agree_rows']}/{cmp_['rows_total']}")
    print(f"wrote {out} in {results['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
