"""One ``Engine`` interface over two ways of running vLLM's scheduler.

* **in-process** (:class:`InProcessEngine`): the vLLM importable in this
  interpreter is the requested version, so the driver runs here (the fuzz
  tier's atheris can instrument ``vllm/v1/core`` this way);
* **worker** (:class:`WorkerEngine`): any other version runs in its own
  environment (``kvspec engines install vllm==X``) as a long-lived
  ``python -m engine_adapter.inside.worker`` subprocess spoken to over
  :mod:`engine_adapter.protocol`;
* **warm** (:class:`WarmEngine`): the same worker, started once and shared
  by later commands over a Unix socket until it has been idle for a while
  (:mod:`engine_adapter.host.warm`); ``run``, ``replay --engine``, ``resolve``
  and ``matrix`` use it unless ``KVSPEC_WARM=0``.

Both return the same result dict from ``run(case)``::

    {"engine": "vllm==X", "hits": [...], "queries": [...], "knobs": {...},
     "explain": [...], "timing": {...}, "vllm_files_sha256": "...",
     "harness": {"mode": "inprocess" | "worker", "platform": "cuda" | "cpu"}}
                                                          # and, if vLLM raised,
    "error": {"kind": "vllm", "phase", "request", "type", "message", "traceback"}

kvspec's own errors are raised (one line): InvalidArgument for a bad case
or engine name, Unsupported for a case this vLLM version cannot express,
EngineError when an engine cannot be set up or reached. A worker that dies
or hangs mid-case gives an error result (``kind: "worker"``) and is
restarted on the next call.
"""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from engine_adapter.host import environments, warm, zygote
from engine_adapter.host.builds import inprocess_build_version
from engine_adapter.host.versions import EngineSpec, engine_name, family_of, spec_of
from engine_adapter.interface import Observation, get_driver, observation_problem
from engine_adapter.protocol import PROTOCOL_VERSION, decode, encode
from ground import errors as kvspec_errors
from ground.engines import DEFAULT_FAMILY
from ground.errors import EngineError, InvalidArgument
from reference.case import Case, case_to_dict, parse_case

MODES = ("auto", "inprocess", "worker", "warm")
#: Seconds a worker may take to import vLLM and say hello.
START_TIMEOUT_S = 180.0
#: Default seconds one case may take in a worker.
RUN_TIMEOUT_S = 600.0


def _as_case_dict(case: Case | dict) -> dict:
    """Validate locally (one-line InvalidArgument) and return the canonical dict."""
    parsed = case if isinstance(case, Case) else parse_case(case)
    return case_to_dict(parsed)


def inprocess_vllm_version() -> str | None:
    """The vLLM version importable here, without importing it (in a build's
    environment: the build, ``X+LABEL.HASH``; ``engine_adapter.host.builds``)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    build = inprocess_build_version()
    if build is not None:
        return build
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


class Engine:
    """A vLLM version kvspec can run cases against."""

    mode: str = "?"

    def __init__(self, version: str | EngineSpec) -> None:
        #: The typed engine (``ground.engines.EngineSpec``): what a worker receives, serialized.
        self.spec = spec_of(version)
        self.version = self.spec.version
        self.engine = self.spec.name

    def run(self, case: Case | dict, options: dict | None = None) -> dict:
        raise NotImplementedError

    def resolve(self, case: Case | dict) -> dict:
        """vLLM's resolution of a deployment case: geometry, facts, assumptions."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.engine}>"


class InProcessEngine(Engine):
    mode = "inprocess"

    def __init__(self, version: str | EngineSpec) -> None:
        super().__init__(version)
        family = self.spec.family_entry
        try:
            self.driver = get_driver(family.name)  # imports the engine here
        except ImportError as e:
            raise EngineError(
                f"engine={self.engine!r}: in-process mode needs {family.title} importable here ({e})"
            ) from None
        if self.driver.version != self.spec.release:
            raise EngineError(f"engine={self.engine!r}: this interpreter imports {family.title} {self.driver.version}")

    def run(self, case: Case | dict, options: dict | None = None) -> Observation:
        result = self.driver.run(case if isinstance(case, Case) else parse_case(case), options)
        problem = observation_problem(result)
        if problem is not None:
            return _harness_error(self.engine, "internal", problem)
        return _tag(result, self.mode)

    def resolve(self, case: Case | dict) -> dict:
        return self.driver.resolve(case if isinstance(case, Case) else parse_case(case))


class WorkerProcess:
    """One ``python -m engine_adapter.inside.worker`` process of an engine
    environment, under one platform (``engine_adapter.vllm_engine.platform``)."""

    def __init__(
        self,
        version: str | EngineSpec,
        platform: str = "cuda",
        *,
        python: str | None = None,
        start_timeout: float = START_TIMEOUT_S,
        run_timeout: float = RUN_TIMEOUT_S,
    ) -> None:
        self.spec = spec_of(version)  # the worker receives it serialized (--engine JSON)
        self.version = self.spec.version
        self.engine = self.spec.name
        self.platform = platform
        self.python = python or str(environments.env_python(self.version))
        self.start_timeout = start_timeout
        self.run_timeout = run_timeout
        self.proc: subprocess.Popen | None = None
        self.hello: dict | None = None
        self._lines: queue.Queue = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._next_id = 0
        self.restarts = 0

    # -------------------------------------------------------- process

    def start(self) -> dict:
        if self.proc is not None and self.proc.poll() is None:
            return self.hello or {}
        if not os.path.exists(self.python):
            raise EngineError(
                f"engine={self.engine!r}: not installed (no {self.python}); run: kvspec engines install {self.engine}"
            )
        self._lines = queue.Queue()
        argv = ["--engine", self.spec.to_json()]
        env = environments.worker_env(self.version, self.platform)
        self.proc = zygote.spawn(
            self.spec, self.python, argv, env=env, streams=zygote.PIPES, start_timeout=self.start_timeout
        ) or subprocess.Popen(
            [self.python, "-m", "engine_adapter.inside.worker", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
            env=env,
            cwd=str(environments.REPO_ROOT),
        )
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        msg = self._read(self.start_timeout)
        if msg is None:
            self._kill()
            raise EngineError(
                f"engine={self.engine!r}: worker did not start within {self.start_timeout:.0f}s or exited: {self._last_stderr()}"
            )
        if msg.get("protocol") != PROTOCOL_VERSION or msg.get("event") != "hello":
            self._kill()
            raise EngineError(
                f"engine={self.engine!r}: worker speaks protocol={msg.get('protocol')!r}, expected {PROTOCOL_VERSION}"
            )
        if msg.get("vllm_version") != self.spec.release:
            self._kill()
            raise EngineError(
                f"engine={self.engine!r}: worker environment has {msg.get('engine') or msg.get('vllm_version')}"
            )
        self.hello = msg
        return msg

    @staticmethod
    def _pump(stream, q: queue.Queue) -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    def _drain(self, stream) -> None:
        for line in stream:
            self._stderr.append(line.rstrip())

    def _last_stderr(self) -> str:
        lines = [x for x in self._stderr if x.strip()]
        return lines[-1][:300] if lines else "(no stderr)"

    def _read(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                return None
            try:
                return decode(line)
            except ValueError:
                self._stderr.append(f"[non-protocol stdout] {line.rstrip()}")

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.proc = None
        self.hello = None

    def close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(encode({"id": -1, "op": "shutdown"}))
                proc.stdin.flush()
                proc.wait(timeout=10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._kill()

    # -------------------------------------------------------- requests

    def request(self, op: str, timeout: float, **fields: Any) -> dict:
        """Send one request; return the worker's response, or an ``ok: false``
        response of kind ``worker`` if it died or timed out (it is then killed
        and restarted by the next call)."""
        self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self._next_id += 1
        rid = self._next_id
        try:
            self.proc.stdin.write(encode({"id": rid, "op": op, **fields}))
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self._kill()
            self.restarts += 1
            return {
                "id": rid,
                "ok": False,
                "error": {"kind": "worker", "message": f"worker exited before the request: {self._last_stderr()}"},
            }
        while True:
            msg = self._read(timeout)
            if msg is None:
                alive = self.proc is not None and self.proc.poll() is None
                why = (
                    f"timed out after {timeout:.0f}s"
                    if alive
                    else f"worker died (exit {self.proc.returncode if self.proc else '?'})"
                )
                self._kill()
                self.restarts += 1
                return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"{why}: {self._last_stderr()}"}}
            if msg.get("id") == rid:
                return msg

    def ping(self) -> dict:
        resp = self.request("ping", 30)
        if not resp.get("ok"):
            raise EngineError(f"engine={self.engine!r}: {resp['error']['message']}")
        return resp["result"]

    def run(self, case: Case | dict, options: dict | None = None, timeout: float | None = None) -> dict:
        resp = self.request("run", timeout or self.run_timeout, case=_as_case_dict(case), options=options or {})
        return _run_result(self.engine, resp)

    def resolve(self, case: Case | dict, timeout: float | None = None) -> dict:
        """vLLM's resolution of a deployment case (``driver.VllmDriver.resolve``)."""
        resp = self.request("resolve", timeout or self.run_timeout, case=_as_case_dict(case))
        return _resolve_result(self.engine, resp)


def _raise_kvspec(err: dict) -> None:
    """Raise the kvspec error a worker reported (``kind: "kvspec"``)."""
    if err.get("kind") == "kvspec":
        cls = getattr(kvspec_errors, err.get("class", ""), None)
        if isinstance(cls, type) and issubclass(cls, kvspec_errors.KvspecError):
            raise cls(err.get("message", ""))
        raise kvspec_errors.KvspecError(err.get("message", ""))


def _run_result(engine: str, resp: dict, **harness) -> dict:
    """A worker's response to ``run`` as a run result: the result, a
    structured error result for a dead or hung worker or an adapter bug
    (kvspec's failure, never vLLM's), or the kvspec error it reported."""
    if resp.get("ok"):
        problem = observation_problem(resp.get("result"))
        if problem is not None:  # the worker answered something the judge cannot read: kvspec's failure
            return _harness_error(engine, "protocol", problem)
        result = _tag(resp["result"], "worker")
        if harness:
            result["harness"].update(harness)
        return result
    err = resp.get("error") or {}
    _raise_kvspec(err)
    if err.get("kind") in ("worker", "internal"):
        return _harness_error(engine, err["kind"], err.get("message", ""), err.get("traceback"))
    raise EngineError(f"engine={engine!r}: {err.get('message', json.dumps(err))}")


def _harness_error(engine: str, kind: str, message: str, traceback: str | None = None) -> Observation:
    """An observation of nothing, carrying kvspec's own failure (``kind`` is
    never ``vllm``): the judge counts it as a harness error."""
    return {
        "engine": engine,
        "hits": [],
        "queries": [],
        "knobs": None,
        "explain": [],
        "error": {
            "kind": kind,
            "phase": "worker",
            "request": None,
            "type": kind,
            "message": message,
            "traceback": traceback,
        },
    }


def _resolve_result(engine: str, resp: dict) -> dict:
    if resp.get("ok"):
        return resp["result"]
    err = resp.get("error") or {}
    _raise_kvspec(err)
    raise EngineError(
        f"engine={engine!r}: resolve failed ({err.get('kind')}): {err.get('message', json.dumps(err))[:400]}"
    )


class WorkerEngine(Engine):
    """An engine in its own environment: one worker process per platform a
    case asks for (a hand geometry and a ``cuda`` deployment share one), all
    of the same vLLM version."""

    mode = "worker"

    def __init__(
        self,
        version: str | EngineSpec,
        *,
        python: str | None = None,
        start_timeout: float = START_TIMEOUT_S,
        run_timeout: float = RUN_TIMEOUT_S,
    ) -> None:
        super().__init__(version)
        self._options = {"python": python, "start_timeout": start_timeout, "run_timeout": run_timeout}
        self.processes: dict[str, WorkerProcess] = {}
        self.python = python or str(environments.env_python(self.version))
        self.run_timeout = run_timeout

    def process(self, platform: str = "cuda") -> WorkerProcess:
        proc = self.processes.get(platform)
        if proc is None:
            proc = self.processes[platform] = WorkerProcess(self.spec, platform, **self._options)
        return proc

    @property
    def restarts(self) -> int:
        return sum(p.restarts for p in self.processes.values())

    @property
    def hello(self) -> dict | None:
        proc = self.processes.get("cuda")
        return proc.hello if proc is not None else None

    def start(self) -> dict:
        return self.process("cuda").start()

    def ping(self) -> dict:
        return self.process("cuda").ping()

    def run(self, case: Case | dict, options: dict | None = None, timeout: float | None = None) -> dict:
        parsed = case if isinstance(case, Case) else parse_case(case)
        return self.process(_platform_of(parsed)).run(parsed, options, timeout)

    def resolve(self, case: Case | dict, timeout: float | None = None) -> dict:
        parsed = case if isinstance(case, Case) else parse_case(case)
        return self.process(_platform_of(parsed)).resolve(parsed, timeout)

    def close(self) -> None:
        for proc in self.processes.values():
            proc.close()


class WarmEngine(Engine):
    """An engine in its own environment, served by a warm engine
    (:mod:`engine_adapter.host.warm`): one long-lived worker per version and
    platform, shared by every command until it has been idle for its idle
    timeout. ``close`` leaves it running. Results say ``harness.mode:
    worker`` (a worker ran them) and ``harness.warm: true``."""

    mode = "warm"

    def __init__(
        self,
        version: str | EngineSpec,
        *,
        idle_timeout: float | None = None,
        start_timeout: float = START_TIMEOUT_S,
        run_timeout: float = RUN_TIMEOUT_S,
        directory=None,
    ) -> None:
        super().__init__(version)
        self._warm = warm
        self._options = {"idle_timeout": idle_timeout, "start_timeout": start_timeout, "directory": directory}
        self.clients: dict = {}
        self.run_timeout = run_timeout

    def client(self, platform: str = "cuda"):
        c = self.clients.get(platform)
        if c is None:
            c = self.clients[platform] = self._warm.WarmClient(self.spec, platform, **self._options)
        return c

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in self.clients.values())

    def start(self, platform: str = "cuda") -> dict:
        """Make sure the warm engine runs (started if needed); its ping."""
        return self.ping(platform)

    def ping(self, platform: str = "cuda") -> dict:
        resp = self.client(platform).request("ping", 30 + self.client(platform).start_timeout)
        if not resp.get("ok"):
            raise EngineError(f"engine={self.engine!r}: {(resp.get('error') or {}).get('message', '')}")
        return resp["result"]

    def run(self, case: Case | dict, options: dict | None = None, timeout: float | None = None) -> dict:
        parsed = case if isinstance(case, Case) else parse_case(case)
        resp = self.client(_platform_of(parsed)).request(
            "run", timeout or self.run_timeout, case=case_to_dict(parsed), options=options or {}
        )
        return _run_result(self.engine, resp, warm=True)

    def resolve(self, case: Case | dict, timeout: float | None = None) -> dict:
        parsed = case if isinstance(case, Case) else parse_case(case)
        resp = self.client(_platform_of(parsed)).request(
            "resolve", timeout or self.run_timeout, case=case_to_dict(parsed)
        )
        return _resolve_result(self.engine, resp)


def _tag(result: dict, mode: str) -> dict:
    """The run result with the harness mode that ran it (``harness.mode``:
    ``inprocess`` or ``worker``; the driver reports ``harness.platform``)."""
    if isinstance(result, dict):
        harness = result.get("harness")
        result["harness"] = {**(harness if isinstance(harness, dict) else {}), "mode": mode}
    return result


def _platform_of(case: Case) -> str:
    return case.deployment.platform if case.deployment is not None else "cuda"


def open_engine(
    spec: str | EngineSpec = "vllm==0.33.0",
    *,
    mode: str = "auto",
    install: bool = False,
    progress=None,
    warm: bool = False,
) -> Engine:
    """An Engine for ``spec`` (``vllm==X``, or an :class:`EngineSpec` parsed
    at the command line's edge: not parsed again).

    ``mode="auto"`` runs in-process when this interpreter imports vLLM X,
    else in X's environment (installed first if ``install``; otherwise a
    missing environment is an EngineError naming the install command): on
    the warm engine when ``warm`` (the commands pass
    ``engine_adapter.host.warm.enabled()``), else in a worker of its own.
    ``mode="warm"`` asks for the warm engine, ``mode="worker"`` for a
    worker of its own."""
    spec = spec_of(spec)
    version = spec.version
    if mode not in MODES:
        raise InvalidArgument(f"mode={mode!r}: allowed: {', '.join(MODES)}")
    here = inprocess_vllm_version()
    if mode == "inprocess" or (mode == "auto" and here == version):
        if here != version and family_of(version) == DEFAULT_FAMILY:  # another family's driver says (InProcessEngine)
            raise EngineError(
                f"engine={engine_name(version)!r}: in-process mode needs vLLM {version} importable here (found {here or 'none'})"
            )
        return InProcessEngine(spec)
    if not environments.is_ready(version):
        if install:
            environments.install(version, progress=progress or (lambda line: print(line, file=sys.stderr, flush=True)))
        else:
            state = environments.status(version)["state"]
            raise EngineError(
                f"engine={engine_name(version)!r}: environment {state} at {environments.env_dir(version)}; run: kvspec engines install {engine_name(version)}"
            )
    if mode == "warm" or (mode == "auto" and warm):
        return WarmEngine(spec)
    return WorkerEngine(spec)
