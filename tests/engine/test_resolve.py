"""Deployments resolved with vLLM's own code, in the real engine environments.

The figures are what vLLM builds for the shipped configs (and what vLLM's own
``tests/v1/worker/test_gpu_model_runner.py`` asserts for a Qwen3.5 GDN
model: 544 on Triton GDN, 576 with FlashInfer's 64-token checkpoint grid).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from engine_adapter.host import environments
from fuzz.judge.oracles import check_engine_error
from ground.errors import DeploymentRejected, InvalidArgument, Unsupported
from reference.case import case_to_dict, load_case, parse_case
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

MTP2 = '{"method":"mtp","num_speculative_tokens":2}'


def deployment(model="qwen3_next", *flags, device="a100", platform="cuda", overrides=None):
    dep = {"model": model, "vllm_args": ["--enable-prefix-caching", *flags], "platform": platform}
    if platform == "cuda":
        dep["device"] = device
    if overrides:
        dep["model_overrides"] = overrides
    return parse_case({"schema": 1, "deployment": dep, "trace": [{"prompt": [{"segment": "A", "length": 8}]}]})


def block(result: dict) -> int:
    return result["geometry"]["scheduler_block_size"]


@pytest.mark.parametrize(
    ("flags", "device", "expected"),
    [
        ((), "a100", 544),
        (("--speculative-config", MTP2), "a100", 560),
        (("--kv-cache-dtype", "fp8"), "a100", 1072),
        (("--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8", "--speculative-config", MTP2), "a100", 1104),
        (("--tensor-parallel-size", "4"), "a100", 272),
        (("--tensor-parallel-size", "8"), "a100", 144),
        ((), "h100", 576),  # FlashInfer GDN prefill: 64-token checkpoint grid
        (("--gdn-prefill-backend", "triton"), "h100", 544),
    ],
)
def test_qwen3_next_blocks_on_033(engine_033, flags, device, expected):
    r = engine_033.resolve(deployment("qwen3_next", *flags, device=device))
    assert block(r) == expected
    g = r["geometry"]
    assert {x["block_size"] for x in g["groups"]} == {expected}  # attention = Mamba = scheduler block
    assert g["hash_block_size"] == expected
    assert [x["kind"] for x in g["groups"]] == ["mamba", "full_attention"] and g["groups"][0]["count"] == 3


def test_h100_gdn_exports_checkpoints_and_a100_does_not(engine_033):
    h = engine_033.resolve(deployment("qwen3_next", device="h100"))
    a = engine_033.resolve(deployment("qwen3_next", device="a100"))
    assert h["facts"]["gdn_prefill_backend"] == "flashinfer" and h["geometry"]["prefill_checkpoint_grid"] == 576
    assert a["facts"]["gdn_prefill_backend"] == "triton" and a["geometry"]["prefill_checkpoint_grid"] is None


def test_mtp_on_033_uses_lookahead_hashes_not_the_drop(engine_033):
    r = engine_033.resolve(deployment("qwen3_next", "--speculative-config", MTP2))
    assert r["speculative"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert r["facts"]["num_hash_lookahead_tokens"] == 1


def test_the_53504_deployment_resolves_to_1600_and_1568(engine_029):
    """#53504: a Qwen3.x 27B hybrid, TP 2, fp8 KV cache: 1600 with MTP, 1568 without."""
    case = load_case("examples/seed-53504-deployment.json")
    assert block(engine_029.resolve(case)) == 1600
    args = list(case.deployment.vllm_args)
    i = args.index("--speculative-config")
    off = parse_case(
        {
            **json.loads(json.dumps({"schema": 1, "trace": [{"prompt": [{"segment": "A", "length": 8}]}]})),
            "deployment": {**case.deployment.as_dict(), "vllm_args": args[:i] + args[i + 2 :]},
        }
    )
    assert block(engine_029.resolve(off)) == 1568


def test_the_53504_deployment_misses_twice_on_029_and_not_on_033(engine_029, engine_033):
    case = load_case("examples/seed-53504-deployment.json")
    assert engine_029.run(case)["hits"] == [0, 0, 9600]
    assert engine_033.run(case)["hits"] == [0, 11200, 11200]


@pytest.mark.parametrize("model", ["qwen3_next", "qwen3_5", "nemotron_h", "falcon_h1", "granitemoehybrid", "jamba"])
def test_every_shipped_hybrid_resolves_to_one_block_size(engine_033, model):
    r = engine_033.resolve(deployment(model))
    sizes = {x["block_size"] for x in r["geometry"]["groups"]}
    assert len(sizes) == 1 and sizes == {block(r)}
    assert {x["kind"] for x in r["geometry"]["groups"]} == {"mamba", "full_attention"}


def test_fewer_layers_leave_the_geometry_unchanged(engine_033):
    """model_overrides may shrink the layer count (same attention:Mamba
    ratio) without changing what vLLM resolves."""
    full = engine_033.resolve(deployment("qwen3_next"))
    small = engine_033.resolve(
        deployment(
            "qwen3_next",
            overrides={
                "num_hidden_layers": 8,
                "layer_types": ["linear_attention"] * 3
                + ["full_attention"]
                + ["linear_attention"] * 3
                + ["full_attention"],
            },
        )
    )
    assert small["geometry"] == full["geometry"]


def test_bamba_is_refused_as_vllm_serves_it(engine_033):
    with pytest.raises(Unsupported, match="neither hybrid nor attention-free"):
        engine_033.resolve(deployment("bamba"))


@pytest.mark.parametrize("model", ["mamba2", "falcon_mamba"])
@pytest.mark.parametrize(("flags", "expected"), [((), 16), (("--block-size", "256"), 256)])
def test_an_attention_free_model_is_one_mamba_group_on_the_block_size(engine_033, model, flags, expected):
    """vLLM's ``MambaModelConfig`` (align mode, ``mamba_block_size =
    block_size``) and no attention backend to move the block: one KV cache
    group, the unitary coordinator, hits on ``--block-size`` (16 by default)."""
    r = engine_033.resolve(deployment(model, *flags, device="h100"))
    g = r["geometry"]
    assert g["groups"] == [{"kind": "mamba", "block_size": expected, "count": 1}]
    assert g["scheduler_block_size"] == g["hash_block_size"] == expected
    assert r["facts"]["attention_layers"] == 0 and r["facts"]["mamba_cache_mode"] == "align"


def test_one_kv_cache_group_refuses_a_finer_prefix_match_unit_on_033(engine_033):
    """vLLM 0.32.0+ (``resolve_kv_cache_block_sizes``' single-group branch)
    refuses a unit it would otherwise ignore; the example that pins it."""
    with pytest.raises(
        DeploymentRejected, match="with a single KV cache group, prefix-cache hits land on the block size \\(256\\)"
    ):
        engine_033.resolve(load_case("examples/rejected-prefix-match-unit-one-group-deployment.json"))


CRASH = r"""
import json
import vllm.v1.core.kv_cache_utils as ku
from engine_adapter.vllm_engine.driver import get_driver
import engine_adapter.vllm_engine.observe as observe
import engine_adapter.vllm_engine.resolve as R
from engine_adapter.vllm_engine.failure import raised_by_vllm
from reference.case import parse_case
from ground.errors import DeploymentCrashes

case = parse_case(json.loads(%r))
driver = get_driver()
release = driver.run(case)
original = ku.resolve_kv_cache_block_sizes


class OneGroupThatIsNot(list):  # planted: claims one group and holds none, so vLLM's groups[0] raises IndexError
    def __len__(self):
        return 1


def crashing(kv_cache_config, vllm_config):
    kv_cache_config.kv_cache_groups = OneGroupThatIsNot()
    return original(kv_cache_config, vllm_config)


ku.resolve_kv_cache_block_sizes = crashing
R.forget_resolutions()  # the release's resolution is kept per process; ask the planted vLLM again
crashed = driver.run(case)
try:
    driver.resolve(case)
    resolved = "no error"
except DeploymentCrashes as e:
    resolved = str(e)
ku.resolve_kv_cache_block_sizes = lambda *a: [][1]  # planted outside vLLM: kvspec's glue, never vLLM's crash
R.forget_resolutions()
try:
    driver.run(case)
    glue = "no error"
except IndexError:
    glue = "IndexError raised to the harness"
ku.resolve_kv_cache_block_sizes = original


def observer_fails(self, request_id, start):  # planted in kvspec's block-table observer, called at every step
    raise KeyError(request_id)


observe.BlockTable.__call__ = observer_fails
try:
    observed = driver.run(case).get("error") or "no error"
except KeyError:
    observed = "KeyError raised to the harness"
frames = {"here": raised_by_vllm(IndexError())}
print(json.dumps({"release": release["hits"], "crashed": crashed.get("error"), "resolved": resolved, "glue": glue, "observer": observed, **frames}))
"""


def test_a_crash_building_the_kv_cache_is_an_engine_error_and_a_refusal_is_not():
    """vLLM refuses a deployment with ValueError (``assert``,
    ``NotImplementedError``): rejected, never a finding. Any other exception
    raised inside vLLM while it builds the KV cache is a crash: the run
    comes back with ``error`` (phase setup; the ``engine_error`` oracle
    judges it), and ``resolve`` says ``DeploymentCrashes``. The same
    exception raised from kvspec's own code goes to the harness, at start-up
    and at a step (``engine_adapter.vllm_engine.failure.vllm_outcome``)."""
    ensure_env("0.33.0")
    case = load_case("examples/one-group-mamba2-deployment.json")
    proc = subprocess.run(
        [str(environments.env_python("0.33.0")), "-c", CRASH % json.dumps(case_to_dict(case))],
        capture_output=True,
        text=True,
        timeout=600,
        env=environments.worker_env("0.33.0"),
        cwd=str(environments.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["release"] == [0, 1024, 1024, 0, 1024]
    err = out["crashed"]
    assert err["kind"] == "vllm" and err["phase"] == "setup" and err["type"] == "IndexError", err
    assert "kv_cache_utils.py" in err["traceback"]
    (div,) = check_engine_error(case, "0.33.0", {"hits": [], "error": err})
    assert div.oracle == "engine_error" and "IndexError" in div.detail
    assert (
        out["resolved"].startswith("deployment=") and "vLLM crashes resolving it (setup): IndexError" in out["resolved"]
    )
    assert out["glue"] == "IndexError raised to the harness"
    assert (
        out["observer"] == "KeyError raised to the harness"
    )  # a step's own observer: never vLLM's EngineStall or step error
    assert out["here"] is False  # no traceback: not raised in vLLM


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tensor-parallel-size", "3"), "must be divisible by tensor parallel size"),
        (
            ("--scheduling-policy", "bogus"),
            "argument --scheduling-policy: invalid choice",
        ),  # vLLM's parser (a flag off the allow-list, or a size that is no integer, never reaches vLLM: reference.vllm_flags)
        (("--kv-cache-dtype", "fp9"), "Invalid kv_cache_dtype"),
        (("--prefix-match-unit", "100"), "prefix_match_unit"),
    ],
)
def test_a_deployment_vllm_rejects_is_one_line_with_vllms_words(engine_033, flags, message):
    with pytest.raises(DeploymentRejected) as e:
        engine_033.resolve(deployment("qwen3_next", *flags))
    text = str(e.value)
    assert message in text and "\n" not in text and text.startswith("deployment")


def test_an_unknown_model_names_the_field():
    with pytest.raises(InvalidArgument, match="deployment.model"):
        from engine_adapter.vllm_engine.resolve import model_config_dict

        model_config_dict(deployment("no_such_model").deployment)


def test_cli_resolve_rejection_is_exit_2_one_line(tmp_path):
    p = subprocess.run(
        [
            ".venv/bin/kvspec",
            "resolve",
            "--model",
            "qwen3_next",
            "--engine",
            "vllm==0.33.0",
            "--",
            "--enable-prefix-caching",
            "--tensor-parallel-size",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KVSPEC_WARM": "0"},  # the tests' shared warm pool says its housekeeping on stderr
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvspec: deployment=") and "divisible" in lines[0]


def test_layer_checkpoint_facts_still_match_vllms_source():
    """engine_adapter.vllm_engine.standins.CHECKPOINT_EXPORTERS restates which Mamba layers
    export internal prefill checkpoints; check vLLM 0.33.0's source still
    says so (a drift guard, run in that engine's interpreter)."""
    code = (
        "import inspect\n"
        "from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2\n"
        "from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as g\n"
        "from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT as A\n"
        "src = inspect.getsource(MambaMixer2.get_kv_cache_spec)\n"
        "assert 'num_prefill_checkpoint_blocks=1' in src and 'prefill_checkpoint_alignment=1' in src, src\n"
        "gsrc = inspect.getsource(g)\n"
        "assert 'FLASHINFER_GDN_CHECKPOINT_ALIGNMENT' in gsrc and 'get_mamba_prefill_checkpoint_grid' in gsrc\n"
        "assert A == 64\n"
        "print('ok')\n"
    )
    env = environments.worker_env("0.33.0")
    p = subprocess.run(
        [str(environments.env_python("0.33.0")), "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]
    ours = (environments.REPO_ROOT / "engine_adapter" / "vllm_engine" / "standins.py").read_text()
    assert 'CHECKPOINT_EXPORTERS = {"mamba2": (0, 32, 0), "gdn": (0, 33, 0)}' in ours


MEMO_SCRIPT = r"""
import json
from engine_adapter.vllm_engine import resolve as R
from engine_adapter.vllm_engine.driver import VllmDriver
from reference.case import parse_case

def snapshot(res):
    vc = res.vllm_config
    return json.dumps([repr(vc.cache_config), repr(vc.scheduler_config), repr(vc.speculative_config), repr(vc.parallel_config),
                       repr(res.kv_cache_config), res.scheduler_block_size, res.hash_block_size, res.facts], default=str)

dep = {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching", "--speculative-config", '{"method":"mtp","num_speculative_tokens":2,"disable_lookahead_block_hashes":true}'], "platform": "cuda", "device": "a100"}
case = parse_case({"schema": 1, "deployment": dep, "trace": [{"prompt": [{"segment": "A", "length": 1200}]}, {"prompt": [{"segment": "A", "length": 1200}]}, {"prompt": [{"segment": "A", "length": 1700}]}]})
first = R.resolve(case.deployment)
before = snapshot(first)
driver = VllmDriver()
runs = [driver.run(case) for _ in range(2)]
small_blocks = {"model": "mamba2", "vllm_args": ["--enable-prefix-caching", "--block-size", "16"], "platform": "cuda", "device": "a100"}
short = driver.run(parse_case({"schema": 1, "deployment": small_blocks, "trace": [{"prompt": [{"segment": "A", "length": 100}]}] * 2}))
big = driver.run(parse_case({"schema": 1, "deployment": small_blocks, "trace": [{"prompt": [{"segment": s, "length": 2000}]} for s in "ABA"]}))
again = R.resolve(case.deployment)
strip = lambda r: {k: r[k] for k in ("hits", "queries", "explain", "knobs")}
print(json.dumps({"same_object": again is first, "unchanged": snapshot(again) == before,
                  "runs_equal": strip(runs[0]) == strip(runs[1]), "hits": runs[0]["hits"], "big_hits": big["hits"],
                  "pool": short["knobs"]["num_blocks"], "big_pool": big["knobs"]["num_blocks"]}))
"""


def test_a_resolution_is_kept_per_process_and_nothing_writes_to_it():
    """engine_adapter.vllm_engine.resolve keeps each (deployment, pool size) resolution:
    running cases on it leaves vLLM's config objects as resolved, two runs
    of a case observe the same, and a trace too long for the default pool
    gets a larger one (a second resolution) without eviction."""
    ensure_env("0.33.0")
    proc = subprocess.run(
        [str(environments.env_python("0.33.0")), "-c", MEMO_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        env=environments.worker_env("0.33.0"),
        cwd=str(environments.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["same_object"] and out["unchanged"] and out["runs_equal"], out
    assert out["hits"][1] > 0 and out["big_hits"][2] > 0 and out["big_pool"] > out["pool"], out


def test_a_flag_that_vllm_writes_into_a_default_does_not_reach_the_next_deployment(engine_033):
    """vLLM 0.33.0's EngineArgs puts ``--gdn-prefill-backend`` into its
    ``additional_config`` dict, the parser's default object; the serve parser
    is built once per process, so a deployment that names the flag must not
    leave it set for the next one (an H100 Qwen3-Next without the flag keeps
    FlashInfer's prefill and the 576-token block). ``--max-num-seqs 7`` makes
    both deployments new to this engine process."""
    triton = engine_033.resolve(
        deployment("qwen3_next", "--max-num-seqs", "7", "--gdn-prefill-backend", "triton", device="h100")
    )
    auto = engine_033.resolve(deployment("qwen3_next", "--max-num-seqs", "7", device="h100"))
    assert (triton["facts"]["gdn_prefill_backend"], block(triton)) == ("triton", 544)
    assert (auto["facts"]["gdn_prefill_backend"], block(auto)) == ("flashinfer", 576)


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--speculative-config", MTP2),
        ("--speculative-config", '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":2}'),
        ("--tensor-parallel-size", "4", "--kv-cache-dtype", "fp8"),
    ],
)
def test_the_drawn_floor_pool_is_the_least_vllm_accepts(engine_033, flags):
    """``fuzz.draw.generate_pressure``'s ``floor`` on the groups and Mamba
    budget the engine resolved (``mamba_request_blocks``): vLLM builds that
    pool and refuses one block less (kv_cache_planning.py:50-85)."""
    from fuzz.draw import generate_pressure as P

    r = engine_033.resolve(deployment("qwen3_next", *flags, device="h100"))
    budget = r["facts"]["mamba_request_blocks"]
    assert isinstance(budget, int) and budget >= 2
    sizing = P.Sizing(
        (3000, 700), tuple(P.with_budget(r["geometry"]["groups"], budget)), block(r), limit=r["facts"]["max_model_len"]
    )
    least = P.pool_for("floor", sizing)

    def pinned(pool: int):
        return deployment("qwen3_next", *flags, *P.pressure_flags(pool, sizing), device="h100")

    assert engine_033.resolve(pinned(least))["facts"]["num_blocks"] == least
    with pytest.raises(DeploymentRejected, match="larger than the available KV cache memory"):
        engine_033.resolve(pinned(least - 1))
