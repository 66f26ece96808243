"""A case or finding's deployment never loads code, and its sizes are
bounded before vLLM sees it (issue 29).

A generated corpus of hostile deployments, each refused in one line that
names its field: every flag outside the allow-list in every spelling vLLM's
parser reads (``--flag``, ``--flag=v``, ``--flag_with_underscores``, an
abbreviation, a dotted JSON key, ``--config FILE``, ``-O3``), every
``--speculative-config`` key that loads code or a model, ``auto_map`` and
the other code-loading keys in ``model_overrides`` and in a user's
config.json, and layer counts and dimensions past the documented limits.
What must still pass: every shipped example and conformance case, the
generator's draws, the live server's own flags. The ``engine``-marked tests
at the end go through the real ``kvspec resolve`` CLI and vLLM 0.33.0: a
config.json whose ``auto_map`` names a module that writes a marker file
never gets it imported, and a model config that makes vLLM resolve blocks
of 10^9 tokens is refused, not printed.
"""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.models import load_config
from engine_adapter.models.served import MAMBA_KIND, model_config_dict
from ground.errors import InvalidArgument, Unsupported
from ground.home import REPO_ROOT
from reference.deployment import Deployment, parse_deployment
from reference.model_config import MAX_DIMENSION, MAX_LAYERS
from reference.vllm_flags import FLAGS

#: Flags that load code, data or a model by name, or start a server (vLLM 0.33.0).
REFUSED_FLAGS = (
    "--trust-remote-code",
    "--compilation-config",
    "--kv-transfer-config",
    "--hf-overrides",
    "--worker-cls",
    "--worker-extension-cls",
    "--scheduler-cls",
    "--logits-processors",
    "--tool-parser-plugin",
    "--chat-template",
    "--tokenizer",
    "--download-dir",
    "--config",
    "--model",
    "--host",
    "--port",
    "--api-key",
    "--served-model-name",
    "--model-loader-extra-config",
    "--additional-config",
    "--reasoning-parser-plugin",
    "--io-processor-plugin",
    "--hf-config-path",
    "--revision",
    "--code-revision",
    "--spec-model",
    "--spec-method",
    "--attention-backend",
    "--quantization",
    "--pooler-config",
    "--kv-events-config",
    "--ec-transfer-config",
    "--profiler-config",
    "--structured-outputs-config",
    "--optimization-level",
    "--distributed-executor-backend",
)
#: ``--speculative-config`` keys that load code or a model, or are no cache setting.
REFUSED_SPEC_KEYS = (
    "trust_remote_code",
    "auto_map",
    "model",
    "tokenizer",
    "revision",
    "code_revision",
    "quantization",
    "draft_load_config",
    "target_model_config",
    "draft_model_config",
    "kv_connector_module_path",
    "proposer_cls",
    "class_name",
    "drafter_qualname",
    "attention_backend",
    "moe_backend",
)
#: Model config keys that name code to import.
REFUSED_CONFIG_KEYS = (
    "auto_map",
    "trust_remote_code",
    "custom_pipelines",
    "tokenizer_class",
    "processor_class",
    "kv_connector_module_path",
    "worker_cls",
    "inductor_qualname",
    "Auto_Map",
)


def dep(args=(), overrides=None, model="qwen3_next") -> dict:
    raw = {"model": model, "vllm_args": ["--enable-prefix-caching", *args], "platform": "cuda", "device": "h100"}
    if overrides is not None:
        raw["model_overrides"] = overrides
    return raw


def refused(raw: dict) -> str:
    """The one-line message ``parse_deployment`` refuses ``raw`` with."""
    with pytest.raises(InvalidArgument) as e:
        parse_deployment(raw)
    text = str(e.value)
    assert "\n" not in text and text.strip() == text, text
    return text


def spellings(flag: str) -> list[list[str]]:
    """Every way vLLM's parser reads ``flag`` with a value."""
    body = flag[2:]
    out = [
        [flag],
        [flag, "x"],
        [f"{flag}=x"],
        ["--" + body.replace("-", "_"), "x"],
        ["--" + body.replace("-", "_") + "=x"],
        [flag + ".key", "1"],
        [flag + ".key=1"],
    ]
    if len(body) > 4:
        out.append([flag[:-2], "x"])  # an argparse abbreviation
        out.append([(flag[:-2]).replace("-", "_") + "=x"])
    return out


CORPUS = [(flag, form) for flag in REFUSED_FLAGS for form in spellings(flag)]


@pytest.mark.parametrize("flag,form", CORPUS, ids=[" ".join(f) for _, f in CORPUS])
def test_every_spelling_of_a_refused_flag_is_refused_naming_its_index(flag, form):
    text = refused(dep(form))
    assert text.startswith(f"deployment.vllm_args[1]={form[0]!r}: "), text
    assert "allowed: " in text and "--block-size" in text


@pytest.mark.parametrize(
    "form",
    [
        ["-O3"],
        ["-O", "3"],
        ["-O=3"],
        ["-cc", "{}"],
        ["-q", "fp8"],
        ["-qfp8"],
        ["--"],
        ["-tp2"],
        ["-n", "2"],
        ["--help"],
        ["--config=/tmp/x.yaml"],
        ["--ENABLE-PREFIX-CACHING"],
        ["--enable-prefix-caching "],
        ["--trust-remote-code", "--enable-prefix-caching"],
    ],
)
def test_short_and_odd_spellings_are_refused(form):
    text = refused(dep(form))
    assert text.startswith(f"deployment.vllm_args[1]={form[0]!r}: "), text


def test_an_abbreviation_of_an_allowed_flag_and_a_dotted_negative_number_are_refused():
    assert "an abbreviation" in refused(dep(["--enable-prefix"]))
    assert "an abbreviation" in refused(dep(["--max-num-batched", "8192"]))
    # vLLM's parser reads "-1.5" as a dotted key that swallows the next token
    assert refused(dep(["--seed", "-1.5", "--enforce-eager"])).startswith(
        "deployment.vllm_args[1]='--seed': --seed takes a value"
    )


def test_a_benign_config_field_that_only_looks_like_code_is_accepted():
    assert (
        parse_deployment(dep(overrides={"classifier_dropout": 0.0, "num_labels": 2})).model_overrides[
            "classifier_dropout"
        ]
        == 0.0
    )


@pytest.mark.parametrize("model", ["/tmp/\x1b[2Jx/config.json", "/tmp/a\u202eb/config.json", "/tmp/a\nb.json"])
def test_a_model_path_with_control_or_format_characters_is_refused(model):
    assert refused(dep(model=model)).startswith(f"deployment.model={model!r}: ")


def test_a_refused_flag_anywhere_in_the_list_is_found():
    args = [
        "--block-size",
        "64",
        "--tensor-parallel-size",
        "2",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":1}',
        "--trust_remote_code",
    ]
    assert refused(dep(args)).startswith("deployment.vllm_args[7]='--trust_remote_code': loads code")


def test_a_token_that_is_no_flag_and_no_value_is_refused():
    assert refused(dep(["--enforce-eager", "--trust-remote-code"])).startswith(
        "deployment.vllm_args[2]='--trust-remote-code'"
    )
    assert refused(dep(["--enforce-eager", "true"])).startswith("deployment.vllm_args[2]='true': a value with no flag")
    assert refused(dep(["--enforce-eager=1"])).startswith(
        "deployment.vllm_args[1]='--enforce-eager=1': --enforce-eager takes no value"
    )
    assert refused(dep(["--block-size"])).startswith(
        "deployment.vllm_args[1]='--block-size': --block-size takes a value"
    )


@pytest.mark.parametrize("key", REFUSED_SPEC_KEYS)
@pytest.mark.parametrize("spelling", ["--speculative-config", "--speculative_config=", "-sc", "-sc="])
def test_a_speculative_config_key_that_loads_code_is_refused(key, spelling):
    value = json.dumps({"method": "mtp", "num_speculative_tokens": 1, key: "evil_mod.Evil"})
    args = [spelling + value] if spelling.endswith("=") else [spelling, value]
    at = 1 if spelling.endswith("=") else 2
    text = refused(dep(args))
    assert text.startswith(f"deployment.vllm_args[{at}].{key}='evil_mod.Evil': "), text
    assert "allowed keys: method, num_speculative_tokens" in text


@pytest.mark.parametrize(
    "config,field",
    [
        ({"method": "custom_class", "num_speculative_tokens": 1}, "method"),
        ({"method": "evil_mod.Evil", "num_speculative_tokens": 1}, "method"),
        ({"method": "draft_model", "num_speculative_tokens": 1}, "method"),
        ({"method": "mtp", "num_speculative_tokens": 10**9}, "num_speculative_tokens"),
        ({"method": "mtp", "num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"method": "mtp", "num_speculative_tokens": 1, "kv_cache_dtype": "a.b"}, "kv_cache_dtype"),
        (
            {"method": "mtp", "num_speculative_tokens": 1, "disable_lookahead_block_hashes": "yes"},
            "disable_lookahead_block_hashes",
        ),
    ],
)
def test_a_speculative_config_value_out_of_its_type_is_refused(config, field):
    assert refused(dep(["--speculative-config", json.dumps(config)])).startswith(f"deployment.vllm_args[2].{field}=")


@pytest.mark.parametrize(
    "value", ["mtp", "[1]", "NaN", '{"method": NaN}', "{" * 3000, '{"a":' * 600 + "1" + "}" * 600, ""]
)
def test_a_speculative_config_that_is_no_json_object_is_refused(value):
    assert refused(dep(["--speculative-config", value])).startswith(
        ("deployment.vllm_args[2]=", "deployment.vllm_args[2].a=")
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--block-size", str(2**21)],
        ["--block-size=8000000000"],
        ["--mamba-block-size", "2M"],
        ["--max-num-batched-tokens", "2m"],
        ["--max-num-seqs", "1G"],
        ["-tp", "4096"],
        ["--max-model-len", "1T"],
        ["--prefix-cache-retention-interval", str(2**40)],
        ["--load-format", "auto"],
        ["--load-format=tensorizer"],
        ["--max-num-seqs", "1_000_000_000"],
        ["--block-size", "\uff11\uff16"],
        ["--max-num-batched-tokens", "2M"],
        ["--block-size", "1" * 40],
        ["--max-model-len", "+99999999999"],
        ["--kv-offloading-size", "0"],
        ["--kv-offloading-size", "1025"],
        ["--kv-offloading-size", "1e3"],
        ["--kv-offloading-size", "nan"],
        ["--kv-offloading-size", "-1"],
        ["--kv-offloading-size", "4G"],
        ["--kv-offloading-size=\uff14"],
        ["--kv-offloading-backend", "lmcache"],
    ],
)
def test_a_size_flag_past_its_limit_or_a_fixed_flag_off_its_value_is_refused(args):
    text = refused(dep(args))
    assert text.startswith("deployment.vllm_args[1]=") or text.startswith("deployment.vllm_args[2]="), text


def test_the_offloading_connector_flags_are_accepted_within_their_bounds():
    for args in (
        ["--kv-offloading-size", "4"],
        ["--kv-offloading-size=0.5", "--kv-offloading-backend", "native"],
        ["--kv_offloading_size", "1024"],
    ):
        assert parse_deployment({"model": "qwen3_next", "vllm_args": args}).vllm_args == tuple(args)


def test_the_lmcache_backend_is_refused_with_its_reason():
    assert "needs an LMCache server" in refused(dep(["--kv-offloading-backend", "lmcache"]))


@pytest.mark.parametrize("key", REFUSED_CONFIG_KEYS)
def test_a_code_loading_key_in_model_overrides_is_refused(key):
    value = {"AutoConfig": "evil_mod.EvilConfig"}
    assert refused(dep(overrides={key: value})).startswith(f"deployment.model_overrides.{key}=")
    nested = refused(dep(overrides={"text_config": {"num_hidden_layers": 4, key: value}}))
    assert nested.startswith(f"deployment.model_overrides.text_config.{key}="), nested


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"num_hidden_layers": MAX_LAYERS + 1}, "num_hidden_layers"),
        ({"num_hidden_layers": 2**31}, "num_hidden_layers"),
        ({"num_hidden_layers": 10**7}, "num_hidden_layers"),
        ({"mtp_num_hidden_layers": 5000}, "mtp_num_hidden_layers"),
        ({"layer_types": ["linear_attention"] * (MAX_LAYERS + 1)}, "layer_types"),
        ({"hybrid_override_pattern": "M" * (MAX_LAYERS + 1)}, "hybrid_override_pattern"),
        ({"hidden_size": MAX_DIMENSION + 1}, "hidden_size"),
        ({"linear_num_value_heads": 2**31}, "linear_num_value_heads"),
        ({"linear_key_head_dim": 2**24}, "linear_key_head_dim"),
        ({"mamba_d_state": 2**30}, "mamba_d_state"),
        ({"text_config": {"num_hidden_layers": 10**6}}, "text_config.num_hidden_layers"),
        ({"architectures": ["os.system"]}, "architectures"),
        ({"architectures": "Qwen3NextForCausalLM"}, "architectures"),
    ],
)
def test_layers_and_dimensions_past_the_limits_are_refused(overrides, field):
    assert refused(dep(overrides=overrides)).startswith(f"deployment.model_overrides.{field}=")


def _config_file(tmp_path: Path, **fields) -> Path:
    cfg = load_config("qwen3_next")
    cfg.update({"num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"], **fields})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "fields,field",
    [
        ({"auto_map": {"AutoConfig": "evil_mod.EvilConfig"}}, "auto_map"),
        ({"text_config": {"auto_map": {"AutoConfig": "evil_mod.EvilConfig"}}}, "text_config.auto_map"),
        ({"trust_remote_code": True}, "trust_remote_code"),
        ({"num_hidden_layers": 10**7}, "num_hidden_layers"),
        ({"linear_num_value_heads": 2**30}, "linear_num_value_heads"),
    ],
)
def test_a_config_json_is_held_to_the_same_rules_before_vllm_reads_it(tmp_path, fields, field):
    path = _config_file(tmp_path, **fields)
    with pytest.raises(InvalidArgument) as e:
        model_config_dict(Deployment(str(path)))
    assert str(e.value).startswith(f"deployment.model={str(path)!r}: config.json field.{field}="), str(e.value)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000,
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        json.dumps(
            {"architectures": ["Qwen3NextForCausalLM"], "rope_scaling": json.loads('{"a":' * 20 + "1" + "}" * 20)}
        ),
    ],
)
def test_a_config_json_too_deep_or_not_json_is_one_line(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(InvalidArgument) as e:
        model_config_dict(Deployment(str(path)))
    assert str(e.value).startswith(f"deployment.model={str(path)!r}: ") and "\n" not in str(e.value)


def test_a_config_json_or_override_of_an_unknown_architecture_is_refused_before_vllm(tmp_path):
    path = _config_file(tmp_path, architectures=["EvilForCausalLM"])
    with pytest.raises(
        Unsupported,
        match=r"^deployment.model architectures\[0\]='EvilForCausalLM': not an architecture kvspec knows; allowed: ",
    ):
        model_config_dict(Deployment(str(path)))
    with pytest.raises(Unsupported, match=r"architectures\[0\]='LlamaForCausalLM'"):
        model_config_dict(parse_deployment(dep(overrides={"architectures": ["LlamaForCausalLM"]})))
    assert model_config_dict(Deployment(str(_config_file(tmp_path))))["architectures"][0] in MAMBA_KIND


# ---------------------------------------------------------------- what still passes


def test_every_shipped_example_and_conformance_case_still_parses():
    from fuzz.results.findings import load_finding

    paths = sorted(
        glob.glob(str(REPO_ROOT / "examples" / "**" / "*.json"), recursive=True)
        + glob.glob(str(REPO_ROOT / "tests" / "conformance" / "cases" / "**" / "*.json"), recursive=True)
    )
    assert len(paths) >= 50
    deployments = 0
    for p in paths:
        case, _ = load_finding(p)
        deployments += case.deployment is not None
    assert deployments >= 10


@pytest.mark.parametrize(
    "args",
    [
        ["--enable_prefix_caching"],
        ["-tp", "2"],
        ["-tp=2"],
        ["--tensor-parallel-size=2"],
        ["--seed", "-1"],
        ["--max-model-len", "-1"],
        ["--max-model-len", "32k"],
        ["--block-size", "1024"],
        ["--prefix-cache-retention-interval", "None"],
        ["--speculative-config", '{"method":"mtp","num_speculative_tokens":2,"disable_lookahead_block_hashes":true}'],
        ["--speculative-config", '{"method":"qwen3_next_mtp","num_speculative_tokens":1}'],
        ["--no-enable-prefix-caching"],
        ["--disable-chunked-prefill"],
        ["--async-scheduling"],
        ["--enforce-eager"],
        ["--gpu-memory-utilization", "0.9"],
        ["--dtype", "bfloat16"],
        ["--mamba-ssm-cache-dtype", "float32"],
        ["--scheduling-policy", "priority"],
        ["--load-format", "dummy", "--skip-tokenizer-init", "--mamba-cache-mode", "align"],
    ],
)
def test_a_cache_setting_in_any_spelling_is_accepted(args):
    assert parse_deployment(dep(args)).vllm_args[1:] == tuple(args)


def test_the_generators_draws_and_the_live_servers_flags_still_pass():
    from engine_adapter.live.server import ServerConfig, server_deployment
    from fuzz.draw import generate as g
    from fuzz.draw.choosers import RandomChooser

    for seed in range(300):
        rng = random.Random(seed)
        case = g.build_deployment_case(
            RandomChooser(random.Random(seed)),
            lambda d: {"block": rng.choice([64, 256, 544, 2048]), "hash": 16, "max_model_len": 32768},
        )
        assert case.deployment is not None
    server = server_deployment(
        ServerConfig(
            speculative_config='{"method":"mtp","num_speculative_tokens":2}', block_size=256, retention_interval=256
        )
    )
    assert parse_deployment({**server, "model": "/tmp/tiny/config.json"}).vllm_args == tuple(server["vllm_args"])
    assert "--load-format" in FLAGS and "--skip-tokenizer-init" in FLAGS


# ---------------------------------------------------------------- the real CLI, the real engine


def _cli(*argv: str, timeout: float = 300, home: Path | None = None) -> subprocess.CompletedProcess:
    """``kvspec ARGV``; ``home``: its KVSPEC_HOME instead of the tests' own
    (an empty one has no engine environment: a command that starts an
    engine there fails for that instead). Without warm engines
    (``KVSPEC_WARM=0``): the tests' shared pool of warm engines says its own
    housekeeping on stderr (a least recently used one stopped, a busy one
    passed over), which is not the refusal these tests read as one line."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KVSPEC_WARM": "0"}
    if home is not None:
        env["KVSPEC_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "kvspec.cli", *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _evil_model(tmp_path: Path) -> tuple[Path, Path]:
    """A config.json whose ``auto_map`` names a module beside it that writes
    a marker file when imported."""
    marker = tmp_path / "MARKER"
    (tmp_path / "evil_mod.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'qwen3_next'\nEvilModel = None\n"
    )
    _config_file(tmp_path, auto_map={"AutoConfig": "evil_mod.EvilConfig", "AutoModelForCausalLM": "evil_mod.EvilModel"})
    return tmp_path / "config.json", marker


def _one_refusal(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("kvspec: "), (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    return lines[0]


def test_trust_remote_code_with_an_auto_map_config_is_refused_before_any_engine(tmp_path):
    config, marker = _evil_model(tmp_path)
    line = _one_refusal(
        _cli(
            "resolve",
            "--model",
            str(config),
            "--engine",
            "vllm==0.33.0",
            "--",
            "--enable-prefix-caching",
            "--trust-remote-code",
            timeout=120,
        )
    )
    assert "deployment.vllm_args[1]='--trust-remote-code': loads code" in line
    assert not marker.exists()


def _evil_case(tmp_path: Path) -> tuple[Path, Path]:
    """A case file whose deployment serves ``_evil_model``'s folder, and the
    marker its module would write."""
    _, marker = _evil_model(tmp_path)
    case = tmp_path / "case.json"
    case.write_text(
        json.dumps(
            {
                "schema": 1,
                "name": "evil-config",
                "trace": [{"prompt": [{"segment": "A", "length": 100}]}],
                "deployment": {"model": str(tmp_path), "vllm_args": ["--enable-prefix-caching"]},
            }
        )
    )
    return case, marker


@pytest.mark.parametrize("command", ["fuzz", "advise", "resolve", "run", "predict", "matrix"])
def test_a_case_whose_config_json_names_code_is_refused_before_any_engine(tmp_path, command):
    # One line, exit 2, nothing written, in a second (was: the engine
    # started; fuzz counted the case a harness error at the end of the run,
    # exit 3, ~30 s later; advise printed "starting the engine" and refused
    # ~20 s later: the red-team re-probe; resolve and matrix started a warm
    # engine and refused ~11 s later, with a second stderr line when that
    # start stopped another warm engine). Run with an empty KVSPEC_HOME: a
    # command that started an engine first would fail for want of one.
    case, marker = _evil_case(tmp_path)
    out = tmp_path / "out"
    home = tmp_path / "home"
    argv = {
        "fuzz": (
            "fuzz",
            "--engine",
            "vllm==0.33.0",
            "--driver",
            "cases",
            "--no-z3-seeds",
            "--case",
            str(case),
            "--out",
            str(out),
            "--max-time",
            "30",
        ),
        "advise": ("advise", str(case), "--engine", "vllm==0.33.0", "--out", str(out)),
        "resolve": ("resolve", str(case), "--engine", "vllm==0.33.0"),
        "run": ("run", str(case), "--engine", "vllm==0.33.0", "--compare"),
        "predict": ("predict", str(case), "--as", "vllm==0.33.0"),
        "matrix": ("matrix", str(case), "--engine", "vllm==0.33.0"),
    }[command]
    line = _one_refusal(_cli(*argv, timeout=60, home=home))
    assert "config.json field.auto_map=" in line and "names code to import" in line
    assert not marker.exists() and not out.exists()


@pytest.mark.engine
def test_an_auto_map_config_json_never_runs_its_module_in_the_engine(tmp_path):
    from engine_adapter import open_engine
    from ground.engines import EngineSpec
    from ground.errors import InvalidArgument
    from reference.case import load_case
    from tests.engine.conftest import ensure_env

    # The commands refuse such a config before any engine starts (the test
    # above); the engine's own resolve refuses it too, past those checks.
    ensure_env("0.33.0")
    case_path, marker = _evil_case(tmp_path)
    case = load_case(str(case_path))
    with open_engine(EngineSpec.parse("vllm==0.33.0")) as engine:
        with pytest.raises(InvalidArgument, match=r"config\.json field\.auto_map=.*names code to import"):
            engine.resolve(case)
    assert not marker.exists()


@pytest.mark.engine
def test_a_geometry_past_the_case_limits_is_refused_by_resolve_not_printed(tmp_path):
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    case = {
        "schema": 1,
        "name": "huge-mamba-page",
        "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
        "deployment": dep(
            overrides={
                "num_hidden_layers": 4,
                "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                "linear_num_value_heads": 65536,
                "linear_num_key_heads": 65536,
                "linear_value_head_dim": 4096,
                "linear_key_head_dim": 4096,
            }
        ),
    }
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    line = _one_refusal(_cli("resolve", str(path), "--engine", "vllm==0.33.0"))
    assert "outside kvspec's documented case limits; allowed: at most 1,048,576" in line, line
    for argv in (("run", str(path), "--engine", "vllm==0.33.0"), ("predict", str(path), "--as", "vllm==0.33.0")):
        line = _one_refusal(_cli(*argv))
        assert "outside kvspec's documented case limits" in line, (argv, line)
