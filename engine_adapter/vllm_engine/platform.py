"""Which platform vLLM believes it runs on, in an engine process.

kvspec resolves GPU deployments on a CPU-only machine. vLLM asks its
platform object a few hardware questions while it builds a config (device
memory and name for the default token budget, the compute capability for
kernel choices); everything else is vLLM's own Python. So an engine process
runs under one of two platforms (a third, ``native``, for a GPU cross-check), fixed when it starts (``KVSPEC_PLATFORM``):

* ``cuda`` (default): vLLM's own neutral ``UnspecifiedPlatform``, whose
  ``check_and_update_config`` is the interface's no-op (as CUDA's is for
  every cache setting, vLLM 0.29.0-0.33.0), answering the hardware
  questions for the deployment's GPU (:data:`DEVICES`) and giving
  ``CudaPlatform``'s own capability answers (the hybrid KV cache manager is
  supported, as is graph mode). ``is_cuda()`` stays
  false while vLLM imports and inspects models, so no CUDA-only kernel probe
  runs on this machine; kvspec answers ``is_cuda()`` true only inside the
  one vLLM function that picks the Gated DeltaNet prefill kernel
  (:func:`as_cuda`), whose choice changes the block size in 0.33.0.
* ``cpu``: vLLM's real ``CpuPlatform`` (``VLLM_TARGET_DEVICE=cpu``), the live
  test server's platform on this very machine.
* ``native``: kvspec installs nothing and vLLM detects its platform itself;
  only for checking the stand-in on a machine with a real GPU (vLLM's
  ``CudaPlatform`` there serves ``cuda`` deployments), see
  ``engine_adapter/devcheck/h200_resolution.py``. Never chosen by kvspec's
  own commands.

This module must be imported before anything imports ``vllm.platforms``'s
``current_platform`` (``driver.py`` does so first).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

PLATFORMS = ("cuda", "cpu", "native")
#: name -> (compute capability, memory GiB, device name as NVML reports it)
DEVICES = {
    "a100": ((8, 0), 80, "NVIDIA A100-SXM4-80GB"),
    "h100": ((9, 0), 80, "NVIDIA H100 80GB HBM3"),
    "h200": ((9, 0), 141, "NVIDIA H200"),
    "b200": ((10, 0), 180, "NVIDIA B200"),
}
#: CUDA runtime kvspec answers for (vLLM's FlashInfer GDN on SM100 needs >= 13).
CUDA_RUNTIME_MAJOR = 12


def process_platform() -> str:
    """The platform this engine process runs under (``KVSPEC_PLATFORM``)."""
    value = os.environ.get("KVSPEC_PLATFORM", "cuda")
    return value if value in PLATFORMS else "cuda"


_ANSWERS: dict = {"device": "h100", "is_cuda": False}


def install() -> str:
    """Make vLLM's current platform the one this process runs under."""
    platform = process_platform()
    if platform == "cpu":
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
        return platform
    if platform == "native":  # vLLM's own detection (a real GPU's CudaPlatform)
        return platform
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, UnspecifiedPlatform

    class KvspecCudaAnswers(UnspecifiedPlatform):
        """vLLM's neutral platform, answering hardware questions for the
        deployment's GPU (``set_device``)."""

        device_type = "cuda"
        device_name = "cuda"

        @classmethod
        def is_cuda(cls) -> bool:
            return bool(_ANSWERS["is_cuda"])

        @classmethod
        def is_cuda_alike(cls) -> bool:
            return bool(_ANSWERS["is_cuda"])

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            major, minor = DEVICES[_ANSWERS["device"]][0]
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return DEVICES[_ANSWERS["device"]][2]

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return DEVICES[_ANSWERS["device"]][1] << 30

        @classmethod
        def get_cuda_runtime_major(cls) -> int:
            return CUDA_RUNTIME_MAJOR

        # CudaPlatform's capability answers that cache settings read
        # (vLLM disables the hybrid KV cache manager where this is false).
        @classmethod
        def support_hybrid_kv_cache(cls) -> bool:
            return True

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return True

    if (
        getattr(platforms, "_current_platform", None) is None
        or type(platforms._current_platform).__name__ != "KvspecCudaAnswers"
    ):
        platforms._current_platform = KvspecCudaAnswers()
    return platform


def set_device(device: str | None) -> None:
    """Answer hardware questions for ``device`` from now on (cuda only)."""
    _ANSWERS["device"] = device if device in DEVICES else "h100"


@contextlib.contextmanager
def as_cuda() -> Iterator[None]:
    """Answer ``is_cuda()`` true inside the block (one kernel-choice call)."""
    before = _ANSWERS["is_cuda"]
    _ANSWERS["is_cuda"] = process_platform() == "cuda"
    try:
        yield
    finally:
        _ANSWERS["is_cuda"] = before
