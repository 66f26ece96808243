"""vLLM's model-info cache filled at install (engine_adapter.vllm_engine.modelinfo):
which classes are inspected (on a test double of vLLM's registry), and, on
the real vLLM 0.33.0 (slow tier: one child import of vLLM per class), that
the cache file written in-process is byte for byte the one vLLM's own
child process writes."""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from engine_adapter.host import environments
from engine_adapter.vllm_engine.modelinfo import OTHER_CLASSES, classes
from ground.home import REPO_ROOT, kvspec_home


def _registry_double(entries: dict[str, str]):
    """A stand-in for vLLM's ``ModelRegistry``: architecture -> module."""
    return SimpleNamespace(models={a: SimpleNamespace(module_name=m) for a, m in entries.items()})


def test_the_served_classes_their_heads_and_the_drafters_are_picked_and_nothing_else():
    reg = _registry_double(
        {
            "Qwen3NextForCausalLM": "vllm.model_executor.models.qwen3_next",
            "Qwen3NextMTP": "vllm.model_executor.models.qwen3_next_mtp",
            "JambaForCausalLM": "vllm.model_executor.models.jamba",
            "JambaForSequenceClassification": "vllm.model_executor.models.jamba",
            "LlamaForCausalLM": "vllm.model_executor.models.llama",
            "EagleLlamaForCausalLM": "vllm.model_executor.models.llama_eagle",
            "GPT2LMHeadModel": "vllm.model_executor.models.gpt2",
            "MistralForCausalLM": "vllm.model_executor.models.llama",
        }
    )
    assert classes(reg) == [
        "EagleLlamaForCausalLM",
        "JambaForCausalLM",
        "JambaForSequenceClassification",
        "LlamaForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3NextMTP",
    ]
    assert classes(_registry_double({})) == []
    assert set(OTHER_CLASSES) >= {"EagleLlamaForCausalLM", "LlamaForCausalLM"}


SNIPPET = """
import json, sys
from engine_adapter.interface import get_driver
get_driver("vllm")
from vllm.model_executor.models.registry import ModelRegistry
from engine_adapter.vllm_engine import modelinfo
if sys.argv[1] == "warm":
    print(json.dumps(modelinfo.warm()))
else:
    for name in ("JambaForCausalLM", "Qwen3NextForCausalLM"):
        ModelRegistry.models[name].inspect_model_cls()  # vLLM's own child process
    print("{}")
"""


@pytest.mark.engine
@pytest.mark.slow
def test_the_in_process_cache_file_is_the_one_vllms_child_writes(tmp_path):
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    files = {}
    for how in ("warm", "child"):
        home = tmp_path / how
        home.mkdir()
        (home / "engines").symlink_to(environments.env_dir("0.33.0").parent)
        env = {k: v.replace(str(kvspec_home()), str(home)) for k, v in environments.worker_env("0.33.0").items()}
        out = subprocess.run(
            [str(environments.env_python("0.33.0")), "-c", SNIPPET, how],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        if how == "warm":
            assert json.loads(out.stdout.strip().splitlines()[-1])["left_to_vllm"] == 0
        found = {p.name: p.read_bytes() for p in home.rglob("modelinfos/*.json")}
        files[how] = found
    assert files["child"] and all(files["warm"][name] == data for name, data in files["child"].items())
    assert os.path.commonprefix(list(files["warm"])) == "vllm-model_executor-models-"
