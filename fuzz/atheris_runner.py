"""Run atheris campaigns: J worker processes of ``fuzz/fuzz_engine.py``, a
live progress line, a summary at the end.

Each worker is libFuzzer driving the target with its own ``-seed``; all share
the corpus folder (libFuzzer adds every new input there as its own file, so a
kill -9 loses nothing written) and the findings folder (written atomically,
named by signature, so two workers finding one bug write one file). The z3
boundary cases from ``spec/`` are encoded as literal inputs
(``fuzz.codec.encode``) into a seed folder that every worker reads first.

The worker runs in the engine's own environment when that environment
exists (in-process engine, vLLM's ``vllm/v1/core`` instrumented); otherwise
in this interpreter with the engine in a worker process.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from reference.case import Case

from fuzz.codec import encode

TARGET = Path(__file__).resolve().parent / "fuzz_engine.py"
ROOT = TARGET.parent.parent
_PULSE = re.compile(r"^#(\d+)\s.*?cov: (\d+).*?exec/s: (\d+)")


@dataclass
class WorkerState:
    execs: int = 0
    cov: int = 0
    exec_s: int = 0
    findings: list[tuple[float, str, str]] = field(default_factory=list)
    harness_errors: int = 0
    unsupported: int = 0
    lines: list[str] = field(default_factory=list)
    returncode: int | None = None


def write_seeds(cases: list[Case], folder: Path) -> int:
    """Encode seed cases into ``folder`` (one file per case, content-named)."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for case in cases:
        try:
            data = encode(case)
        except ValueError:
            continue
        path = folder / hashlib.sha1(data).hexdigest()
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        n += 1
    return n


#: What a campaign needs inside an engine environment besides vLLM.
FUZZ_TOOLS = ("atheris", "hypothesis", "sortedcontainers")


def ensure_fuzz_tools(python: str) -> bool:
    """Install the fuzzing tools (at this interpreter's versions, no
    dependencies) into an engine environment that lacks them."""
    from importlib.metadata import PackageNotFoundError, version

    probe = subprocess.run([python, "-c", "import atheris, hypothesis"], capture_output=True)
    if probe.returncode == 0:
        return True
    try:
        pins = [f"{name}=={version(name)}" for name in FUZZ_TOOLS]
    except PackageNotFoundError:
        return False
    from engine_adapter.home import contained_env

    done = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--disable-pip-version-check", *pins], capture_output=True, text=True, env=contained_env())
    return done.returncode == 0


def worker_python(engine: str) -> tuple[str, bool]:
    """The interpreter to run the target with, and whether it is in-process."""
    from engine_adapter import environments
    from engine_adapter.versions import parse_engine

    version = parse_engine(engine)
    if environments.is_ready(version):
        python = str(environments.env_python(version))
        if ensure_fuzz_tools(python):
            return python, True
    return sys.executable, False


def _reader(proc: subprocess.Popen, j: int, q: queue.Queue) -> None:
    for raw in proc.stderr:  # type: ignore[union-attr]
        q.put((j, raw.rstrip("\n")))
    q.put((j, None))


def _parse(line: str, st: WorkerState) -> None:
    if line.startswith("kvspec-finding\t"):
        _, elapsed, path, summary = (line.split("\t") + ["", "", ""])[:4]
        st.findings.append((float(elapsed or 0), path, summary))
    elif line.startswith("kvspec-stats\t"):
        parts = line.split("\t")
        st.unsupported = int(parts[2])
    elif line.startswith("kvspec-harness-error"):
        st.harness_errors += 1
    else:
        m = _PULSE.match(line)
        if m:
            st.execs, st.cov, st.exec_s = int(m.group(1)), int(m.group(2)), int(m.group(3))
        st.lines = (st.lines + [line])[-40:]


def run_atheris(
    engine: str,
    *,
    out: Path,
    corpus: Path,
    seed_dir: Path | None,
    seed: int,
    max_time: float,
    jobs: int = 1,
    other: str | None = None,
    libfuzzer_args: list[str] = (),
    console=None,
    env_extra: dict[str, str] | None = None,
) -> dict:
    """Run the campaign; return a summary dict (also shown as a table)."""
    from engine_adapter.home import contained_env

    python, in_process = worker_python(engine)
    corpus.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    env = contained_env()
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).strip(os.pathsep)
    env["KVSPEC_FUZZ_ENGINE"] = engine
    env["KVSPEC_FUZZ_OUT"] = str(out)
    env["KVSPEC_FUZZ_SEED"] = str(seed)
    if other:
        env["KVSPEC_FUZZ_OTHER"] = other
    dirs = [str(corpus)] + ([str(seed_dir)] if seed_dir else [])
    artifacts = out / "libfuzzer-artifacts"  # slow units and the like, never in the work tree
    artifacts.mkdir(parents=True, exist_ok=True)
    q: queue.Queue = queue.Queue()
    procs, states = [], []
    started = time.monotonic()
    for j in range(jobs):
        cmd = [python, str(TARGET), f"-seed={seed + j}", f"-max_total_time={int(max_time)}", "-print_final_stats=1", "-timeout=120", "-rss_limit_mb=8192", f"-artifact_prefix={artifacts}/", *libfuzzer_args, *dirs]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        states.append(WorkerState())
        threading.Thread(target=_reader, args=(proc, j, q), daemon=True).start()

    live = _live(console)
    open_streams = jobs
    # libFuzzer checks -max_total_time only after the seed corpus has run;
    # past this deadline the workers are stopped (SIGTERM: libFuzzer exits 72).
    deadline = started + max_time + 30
    try:
        while open_streams and time.monotonic() < deadline:
            try:
                j, line = q.get(timeout=0.5)
            except queue.Empty:
                line = ""
                j = -1
            if line is None:
                open_streams -= 1
            elif j >= 0:
                _parse(line, states[j])
            if live:
                live.update(_progress(engine, states, time.monotonic() - started, in_process))
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if live:
            live.stop()
    for proc, st in zip(procs, states):
        st.returncode = proc.returncode
    findings = sorted({(t, p, s) for st in states for (t, p, s) in st.findings})
    return {
        "engine": engine,
        "in_process": in_process,
        "jobs": jobs,
        "elapsed_s": round(time.monotonic() - started, 2),
        "execs": sum(st.execs for st in states),
        "exec_per_s": sum(st.exec_s for st in states),
        "coverage": max((st.cov for st in states), default=0),
        "unsupported": sum(st.unsupported for st in states),
        "harness_errors": sum(st.harness_errors for st in states),
        "findings": [{"at_s": t, "path": p, "summary": s} for t, p, s in findings],
        "first_finding_s": findings[0][0] if findings else None,
        "worker_exit_codes": [st.returncode for st in states],
        "stopped_at_deadline": any(st.returncode in (72, -signal.SIGTERM) for st in states),
        "worker_tail": states[0].lines[-5:] if states else [],
    }


def _live(console):
    if console is None:
        return None
    from rich.live import Live

    live = Live(console=console, refresh_per_second=4, transient=True)
    live.start()
    return live


def _progress(engine: str, states: list[WorkerState], elapsed: float, in_process: bool):
    from rich.text import Text

    execs = sum(s.execs for s in states)
    rate = sum(s.exec_s for s in states)
    cov = max((s.cov for s in states), default=0)
    found = len({p for s in states for (_, p, _) in s.findings})
    mode = "in-process" if in_process else "worker"
    return Text(f"{engine} [{mode}] {elapsed:6.1f}s  execs {execs}  {rate} exec/s  cov {cov}  findings {found}")
