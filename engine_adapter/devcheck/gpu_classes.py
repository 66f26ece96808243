"""Replay the open vLLM 0.33.0 classes that need a GPU on a real vLLM server.

Issue 27, item 5: the classes kvspec finds on CPU whose mechanism lives in
GPU-only code (MTP with the EAGLE drop, Mamba internal prefill checkpoints
on Hopper, the stale state after a partial hit) are checked here on a real
``vllm serve`` of a tiny model with dummy weights, on 127.0.0.1, one class
at a time. **Not yet run on a GPU** (docs/live.md, "The GPU classes").

Per class (:data:`CLASSES`, each an ``examples/`` deployment):

1. the example's model config (``engine_adapter.models.served.model_config_dict``,
   the config a run reads) shrunk: few layers of the same kinds, few
   experts, a 1,024-token vocabulary, and every head count divided by the
   example's tensor parallelism, so that one GPU holds the per-rank shapes of
   the example (the Mamba state page and the attention page, hence the
   block vLLM resolves, are per rank); served with ``--tensor-parallel-size
   1 --load-format dummy --skip-tokenizer-init --enforce-eager``;
2. the server's ``vllm:cache_config_info`` block size is checked against
   the example's (:attr:`GpuClass.block`): another block is ``geometry
   differs`` and nothing else is judged;
3. the example's trace is replayed by kvspec's own live path (``kvspec
   replay CASE --server URL --rule replay --json``, ``fuzz.replaying.live_replay``:
   the prefix-cache counters of ``/metrics`` around each request) and the
   hits compared with the release's hits on CPU (:attr:`GpuClass.release`)
   and the promise's (:attr:`GpuClass.promise`);
4. for the stale class, every request's greedy tokens (temperature 0, 8
   tokens) are read from the server and again from a cache-cold server
   (``--no-enable-prefix-caching``, the same dummy weights: vLLM's dummy
   loader seeds its initialisation); the first request, which hits nothing
   on either, is the control: if its tokens differ the comparison is
   ``inconclusive``.

One line per class: ``class=ID geometry=... hits=... verdict=...``.

Usage::

    python -m engine_adapter.devcheck.gpu_classes --plan DIR         # CPU: writes configs, cases, commands; starts nothing
    python -m engine_adapter.devcheck.gpu_classes --run DIR [--python VLLM_PY | --install VENV] [--classes a,b]

``--install VENV`` makes a virtual environment and installs
``vllm==0.33.0`` (CUDA wheels from PyPI: needs network); ``--python`` uses
an interpreter that already imports vLLM 0.33.0. Every wait is bounded
(:data:`READY_S`, :data:`REQUEST_S`); each server runs in its own process
group and is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.live.server import Server, free_port, wait_healthy
from engine_adapter.models.served import model_config_dict
from ground.errors import KvspecError, invalid
from ground.home import REPO_ROOT
from reference.case import parse_case, prompt_tokens
from reference.deployment import get_flag, parse_deployment, set_flag

#: Seconds to wait for a server's /health (model load with dummy weights, CUDA graphs off).
READY_S = 600
#: Seconds one HTTP request may take.
REQUEST_S = 120
#: Greedy tokens read per request for the stale class.
GREEDY_TOKENS = 8
VLLM = "vllm==0.33.0"
#: Head counts a tensor-parallel rank holds a share of (divided by TP in the tiny model).
HEAD_KEYS = (
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "mamba_n_heads",
)
#: Width keys that follow the heads they are made of (Falcon-H1's Mamba inner width).
WIDTH_KEYS = ("mamba_d_ssm",)


@dataclass(frozen=True)
class GpuClass:
    id: str
    example: str  # under examples/
    block: int  # the scheduler block vLLM resolves for the example (examples/README.md)
    release: list[int]  # vLLM 0.33.0's hits on CPU (kvspec run)
    promise: list[int]  # the promise's hits
    stale: bool = False  # compare greedy tokens against a cache-cold server


CLASSES = (
    GpuClass("dense-below-sparse", "dense-below-sparse-hashed-qwen3_next.json", 1152, [0, 1152], [0, 1184]),
    GpuClass("resend-beside-checkpoint", "r1-hashed-periodic-eagle-drop-qwen3_5.json", 320, [0, 1280], [0, 1632]),
    GpuClass(
        "stale-state",
        "stale-state-after-partial-hit-falcon_h1.json",
        144,
        [0, 16, 144, 144],
        [0, 16, 144, 144],
        stale=True,
    ),
)
BY_ID = {c.id: c for c in CLASSES}


def tiny_config(deployment: dict) -> dict:
    """The example's model config (as a run reads it) shrunk to a few layers
    with every per-rank shape kept (module docstring, step 1)."""
    dep = parse_deployment(deployment)
    cfg = dict(model_config_dict(dep))
    tp = int(get_flag(dep.vllm_args, "--tensor-parallel-size") or 1)
    for key in HEAD_KEYS + WIDTH_KEYS:
        if isinstance(cfg.get(key), int) and cfg[key] % tp == 0:
            cfg[key] //= tp
    if isinstance(cfg.get("layer_types"), list):  # Qwen3-Next / Qwen3.5: the first full-attention period
        first = cfg["layer_types"].index("full_attention") + 1
        cfg["layer_types"] = cfg["layer_types"][:first]
        cfg["num_hidden_layers"] = first
    else:
        cfg["num_hidden_layers"] = 2
    if cfg.get("num_experts"):
        cfg["num_experts"], cfg["num_experts_per_tok"] = 8, 2
    cfg["vocab_size"] = 1024
    return cfg


def serve_args(deployment: dict, model_dir: Path, port: int, cold: bool = False) -> list[str]:
    """``vllm serve`` arguments of the tiny deployment on 127.0.0.1."""
    args = tuple(parse_deployment(deployment).vllm_args)
    args = set_flag(args, "--tensor-parallel-size", "1")
    if cold:
        args = tuple("--no-enable-prefix-caching" if a == "--enable-prefix-caching" else a for a in args)
    return [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "8192",
        *args,
    ]


def plan(out: Path, classes: tuple[GpuClass, ...] = CLASSES) -> list[dict]:
    """Write each class's tiny model config and replay case under ``out``;
    return the plan (what :func:`run` starts and sends). Starts nothing."""
    rows = []
    for c in classes:
        example = json.loads((REPO_ROOT / "examples" / c.example).read_text())
        dep = example["deployment"]
        model_dir = out / c.id / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(tiny_config(dep), indent=1))
        case = {
            "schema": 1,
            "name": f"gpu-{c.id}",
            "trace": example["trace"],
            "deployment": {
                **dep,
                "model": str(model_dir),
                "model_overrides": {},
                "vllm_args": list(set_flag(tuple(dep["vllm_args"]), "--tensor-parallel-size", "1")),
            },
        }
        parse_case(case)  # the case kvspec replay reads: refused here, on CPU, if malformed
        (out / c.id / "case.json").write_text(json.dumps(case, indent=1))
        rows.append(
            {
                "class": c.id,
                "example": c.example,
                "block": c.block,
                "release": c.release,
                "promise": c.promise,
                "stale": c.stale,
                "model_dir": str(model_dir),
                "case": str(out / c.id / "case.json"),
                "serve": serve_args(dep, model_dir, 0),
                "cold_serve": serve_args(dep, model_dir, 0, cold=True) if c.stale else None,
                "prompts": [len(prompt_tokens(r)) for r in parse_case(case).trace],
            }
        )
    (out / "plan.json").write_text(json.dumps(rows, indent=1))
    return rows


# ---------------------------------------------------------------- the GPU run


def _get(url: str, timeout: float = REQUEST_S) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - our own server on 127.0.0.1
        return r.read(8 << 20)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_S) as r:  # noqa: S310
        return json.loads(r.read(8 << 20))


def server_block(url: str) -> int | None:
    """The ``block_size`` label of ``vllm:cache_config_info`` on ``/metrics``."""
    for line in _get(url + "/metrics").decode(errors="replace").splitlines():
        if line.startswith("vllm:cache_config_info{") and 'block_size="' in line:
            return int(line.split('block_size="', 1)[1].split('"', 1)[0])
    return None


def greedy(url: str, case_path: Path) -> list[list[int]]:
    """Each request's first :data:`GREEDY_TOKENS` greedy token ids, serially."""
    out = []
    for r in parse_case(json.loads(case_path.read_text())).trace:
        body = {
            "model": "tiny",
            "prompt": prompt_tokens(r),
            "max_tokens": GREEDY_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        out.append(_post(url + "/v1/completions", body)["choices"][0].get("token_ids") or [])
    return out


def _serve(python: str, row: dict, key: str, log: Path) -> Server:
    """The live tier's server handle (``engine_adapter.live.server``: own
    process group, stopped by its PID, /health waited for within READY_S)."""
    argv = list(row[key])
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [python, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(proc, port, log, "tiny")
    try:
        server.started_s = wait_healthy(server, READY_S)
    except BaseException:
        server.stop()
        raise
    return server


def verdict(row: dict, block: int | None, hits: list[int] | None, greedy: tuple[list, list] | None) -> str:
    """One line for a class (module docstring); pure, so the plan test checks it."""
    parts = [f"class={row['class']}"]
    if block != row["block"]:
        return " ".join(parts + [f"geometry=differs block={block} example={row['block']}", "verdict=inconclusive"])
    parts.append(f"geometry=block {block}")
    parts.append(f"hits={hits}")
    if hits is None:
        return " ".join(parts + ["verdict=inconclusive (the replay judged the run untrustworthy)"])
    if hits == row["release"] and hits != row["promise"]:
        word = "reproduced (the release's CPU hits, below the promise)"
    elif hits == row["promise"]:
        word = "the promise holds on the GPU" if hits != row["release"] else "hits as on CPU"
    else:
        word = f"differs from CPU (release {row['release']}, promise {row['promise']})"
    parts.append(f"verdict={word}")
    if greedy is not None:
        warm, cold = greedy
        if not warm or not cold or warm[0] != cold[0]:
            parts.append("greedy=inconclusive (the first request's tokens differ cold and warm: not the same weights)")
        else:
            bad = [i for i, (a, b) in enumerate(zip(warm, cold)) if a != b]
            parts.append(f"greedy=differ at requests {bad}" if bad else "greedy=same as cache-cold")
    return " ".join(parts)


def run(out: Path, python: str, classes: tuple[GpuClass, ...]) -> list[str]:
    lines = []
    for row in plan(out, classes):
        d = Path(row["model_dir"]).parent
        server = _serve(python, row, "serve", d / "server.log")
        try:
            block = server_block(server.url)
            hits = None
            if block == row["block"]:
                report = d / "replay.json"
                # the vLLM interpreter runs kvspec's replay: it resolves the deployment case in-process (docs/live.md, "Deployment cases")
                env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
                subprocess.run(
                    [
                        python,
                        "-m",
                        "kvspec.cli",
                        "replay",
                        row["case"],
                        "--server",
                        server.url,
                        "--model",
                        "tiny",
                        "--rule",
                        "replay",
                        "--json",
                        str(report),
                    ],
                    cwd=REPO_ROOT,
                    env=env,
                    timeout=READY_S,
                    check=False,
                )
                if report.exists():
                    rep = json.loads(report.read_text())
                    hits = (
                        [r.get("hits") for r in rep.get("requests") or []]
                        if rep.get("verdict") != "inconclusive"
                        else None
                    )
            warm = greedy(server.url, Path(row["case"])) if row["stale"] and block == row["block"] else None
        finally:
            server.stop()
        cold = None
        if warm is not None:
            server = _serve(python, row, "cold_serve", d / "cold-server.log")
            try:
                cold = greedy(server.url, Path(row["case"]))
            finally:
                server.stop()
        line = verdict(row, block, hits, (warm, cold) if warm is not None else None)
        print(line, flush=True)
        lines.append(line)
    (out / "verdicts.txt").write_text("\n".join(lines) + "\n")
    return lines


def install(venv: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", VLLM], check=True, timeout=1800)
    return str(venv / "bin" / "python")


def _refuse(line: str):
    """One line on stderr, exit 2 (a bad option)."""
    print(line, file=sys.stderr)
    raise SystemExit(2)


def _out_dir(flag: str, value: str) -> Path:
    """``value`` as the plan's folder: an existing folder, or one that can be
    made; a file, ``/dev/null`` or a path under a file is one line, exit 2."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        _refuse(f"gpu_classes: {flag}={value!r}: not a folder; allowed: a folder (made if absent)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _refuse(f"gpu_classes: {flag}={value!r}: cannot be made ({e.strerror or e}); allowed: a writable folder")
    return path


#: Seconds ``--python`` may take to import vLLM (a check before any server).
PYTHON_CHECK_S = 300


def _check_python(python: str) -> None:
    """``--python`` runs and imports vLLM, else one line, exit 2."""
    try:
        done = subprocess.run(
            [python, "-c", "import vllm"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PYTHON_CHECK_S,
            check=False,
        )
    except (OSError, ValueError) as e:
        _refuse(
            f"gpu_classes: --python={python!r}: does not run ({getattr(e, 'strerror', None) or e}); allowed: an interpreter importing vLLM 0.33.0"
        )
    except subprocess.TimeoutExpired:
        _refuse(f"gpu_classes: --python={python!r}: did not import vLLM within {PYTHON_CHECK_S} s")
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1][:200]
        _refuse(
            f"gpu_classes: --python={python!r}: cannot import vllm (exit {done.returncode}: {last}); allowed: an interpreter importing vLLM 0.33.0"
        )


def main(argv: list[str] | None = None) -> int:
    """Exit 0 done; 2 a bad option (one line: a plan folder that is a file
    or a device, a ``--python`` that does not run or import vLLM); 3 the run
    itself failed (a server that did not start, a disk error: one line)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", metavar="DIR", help="write the configs, cases and commands; start nothing (CPU)")
    mode.add_argument("--run", metavar="DIR", help="plan, then serve and replay each class (a GPU)")
    p.add_argument("--python", default=None, help="an interpreter that imports vLLM 0.33.0 (CUDA)")
    p.add_argument(
        "--install", default=None, metavar="VENV", help=f"create VENV and pip install {VLLM} there (needs network)"
    )
    p.add_argument("--classes", default=",".join(BY_ID), help=f"comma-separated; allowed: {', '.join(BY_ID)}")
    a = p.parse_args(argv)
    chosen = []
    for name in a.classes.split(","):
        if name not in BY_ID:
            _refuse("gpu_classes: " + str(invalid("--classes", name, f"allowed: {', '.join(BY_ID)}")))
        chosen.append(BY_ID[name])
    out = _out_dir("--plan" if a.plan else "--run", a.plan or a.run)
    if a.plan:
        try:
            rows = plan(out, tuple(chosen))
        except OSError as e:
            print(f"gpu_classes: --plan={a.plan!r}: writing failed ({e.strerror or e})", file=sys.stderr)
            return 3
        for row in rows:
            print(
                f"class={row['class']} block={row['block']} prompts={row['prompts']} serve=python {' '.join(row['serve'])}"
            )
        return 0
    python = a.python or (install(Path(a.install)) if a.install else None)
    if python is None:
        _refuse("gpu_classes: --python=None: allowed: an interpreter importing vLLM 0.33.0, or --install VENV")
    _check_python(python)
    try:
        run(out, python, tuple(chosen))
    except (KvspecError, OSError, subprocess.SubprocessError, RuntimeError, TimeoutError) as e:
        print(f"gpu_classes: the run failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
