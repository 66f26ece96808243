"""Run atheris campaigns: J worker processes of ``fuzz/driving/fuzz_engine.py``, a
live progress line, a summary at the end.

Each worker is libFuzzer driving the target with its own ``-seed``; all share
the corpus folder (libFuzzer adds every new input there as its own file, so a
kill -9 loses nothing written) and the findings folder (written atomically,
named by signature, so two workers finding one bug write one file). The z3
boundary cases from ``spec/`` are encoded as literal inputs
(``fuzz.draw.codec.encode``) into a seed folder that every worker reads first.

The worker runs in the engine's own environment when that environment
exists (in-process engine, vLLM's ``vllm/v1/core`` instrumented); otherwise
in this interpreter with the engine in a worker process.

The deadline is the campaign's wall limit, start-up included: the workers
are told to stop a second before it (``-max_total_time`` from their own
start, see ``fuzz_engine``) and are stopped (SIGTERM, then SIGKILL) at it,
``STOP_GRACE_S`` before the caller's deadline so the summary fits. Workers
stay in this process's process group and get ``PR_SET_PDEATHSIG``: a
``kill -9`` of the runner (or of its group) leaves none behind. None is
started past the deadline, and libFuzzer's own process flags (``-jobs``,
``-workers``, ``-fork``, ``-merge``) are refused (``LIBFUZZER_PROCESS_FLAGS``):
``--jobs`` is the one bounded way to run more.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine_adapter.host import environments
from engine_adapter.host.venvs import ensure_tools
from engine_adapter.host.versions import spec_of
from fuzz.draw.codec import encode
from fuzz.driving.config import RunConfig
from fuzz.driving.progress import progress_line
from fuzz.driving.summary import ATHERIS_KEYS, CampaignSummary
from ground.engines import EngineSpec
from ground.files import write_bytes_atomic
from ground.home import contained_env
from reference.case import Case

TARGET = Path(__file__).resolve().parent / "fuzz_engine.py"
ROOT = TARGET.parents[2]
#: libFuzzer's status line; ``cov:`` is absent while nothing is covered.
_PULSE = re.compile(r"^#(\d+)\s+[A-Z]*[a-z]*\b(?:.*?cov: (\d+))?.*?exec/s: (\d+)")
_FINAL_EXECS = re.compile(r"^stat::number_of_executed_units: (\d+)")
#: libFuzzer flags that start processes of their own, out of the runner's
#: reach (its deadline, its count of workers): refused, use --jobs.
LIBFUZZER_PROCESS_FLAGS = ("-jobs", "-workers", "-fork", "-merge")


def process_flag(args) -> str | None:
    """The first libFuzzer argument that would start processes of its own
    (``LIBFUZZER_PROCESS_FLAGS``), or None."""
    return next((a for a in args if a.split("=", 1)[0] in LIBFUZZER_PROCESS_FLAGS), None)


#: Seconds before the caller's deadline at which workers are stopped, so
#: stopping them and printing the summary still end by the deadline.
STOP_GRACE_S = 2.0


@dataclass
class WorkerState:
    execs: int = 0  # libFuzzer's inputs
    engine_runs: int = 0  # the campaign's engine runs (a case and its variants)
    cases: int = 0  # the campaign's cases checked
    cov: int = 0
    exec_s: int = 0
    findings: list[tuple[float, str, str]] = field(default_factory=list)
    harness_errors: int = 0
    unsupported: int = 0
    rejected: int = 0
    duplicates: int = 0
    lines: list[str] = field(default_factory=list)
    returncode: int | None = None
    stopped: bool = False  # stopped by the runner (deadline, Ctrl-C)
    ready_at: float | None = None  # time.monotonic() when the worker's start-up was done

    @property
    def died(self) -> bool:
        """A worker died when it exited non-zero without being stopped."""
        return self.returncode not in (0, None) and not self.stopped


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
            write_bytes_atomic(path, data)
        n += 1
    return n


#: What a campaign needs inside an engine environment besides vLLM.
FUZZ_TOOLS = ("atheris", "hypothesis", "sortedcontainers")


def ensure_fuzz_tools(python: str, timeout: float | None = None) -> bool:
    """Install the fuzzing tools (at this interpreter's versions, no
    dependencies) into an engine environment that lacks them; bounded by
    ``timeout`` seconds (``engine_adapter.host.venvs.ensure_tools``)."""

    return ensure_tools(python, ("atheris", "hypothesis"), FUZZ_TOOLS, timeout)


def worker_python(engine: EngineSpec, timeout: float | None = None) -> tuple[str, bool]:
    """The interpreter to run the target with, and whether it is in-process."""

    version = engine.version
    if environments.is_ready(version):
        python = str(environments.env_python(version))
        if ensure_fuzz_tools(python, timeout):
            return python, True
    return sys.executable, False


def target_env(engine: EngineSpec, in_process: bool) -> dict[str, str]:
    """The fuzz target's environment. In-process the target is an engine
    process, with the settings every engine worker gets
    (``environments.worker_env``: the platform, and the torchvision stub
    without which vLLM cannot import Qwen3.5's model class and every
    Qwen3.5 deployment would fail to resolve); else kvspec's own."""

    env = environments.worker_env(engine.version) if in_process else contained_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).strip(os.pathsep)
    return env


def argv_with_deadline(argv: list[str], seconds_left: float | None) -> list[str]:
    """libFuzzer counts ``-max_total_time`` from its own start, after the
    engine was set up; the campaign's deadline counts from the runner's. So
    the flag becomes the seconds left (at least 1: 0 would mean no limit)."""
    if seconds_left is None:
        return list(argv)
    left = max(1, int(seconds_left))
    out = [a for a in argv if not a.startswith("-max_total_time=")]
    given = [int(a.split("=", 1)[1]) for a in argv if a.startswith("-max_total_time=") and a.split("=", 1)[1].isdigit()]
    limit = min([left] + [g for g in given if g > 0])
    return out[:1] + [f"-max_total_time={limit}"] + out[1:]


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
        st.engine_runs = int(parts[1])
        st.unsupported = int(parts[2])
        if len(parts) > 7:
            st.cases = int(parts[7])
        if len(parts) > 6:
            st.rejected = int(parts[6])
        if len(parts) > 4:
            st.duplicates = int(parts[4])
    elif line.startswith("kvspec-harness-error"):
        st.harness_errors += 1
    elif line.startswith("kvspec-ready"):
        st.ready_at = time.monotonic()
    else:
        m = _PULSE.match(line)
        if m:
            st.execs, st.exec_s = int(m.group(1)), int(m.group(3))
            st.cov = int(m.group(2)) if m.group(2) else st.cov
        final = _FINAL_EXECS.match(line)
        if final:
            st.execs = max(st.execs, int(final.group(1)))
        st.lines = (st.lines + [line])[-40:]


def _stop(procs: list[subprocess.Popen], states: list[WorkerState], wait_s: float) -> None:
    """Stop every worker still running: SIGTERM (libFuzzer prints its final
    stats and exits 72), then SIGKILL after ``wait_s``; each wait bounded."""
    for proc, st in zip(procs, states):
        if proc.poll() is None:
            st.stopped = True
            proc.terminate()
    end = time.monotonic() + wait_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_atheris(
    engine: EngineSpec | str,
    config: RunConfig,
    out: Path,
    corpus: Path,
    seed_dir: Path | None,
    max_time: float,
    *,
    other: EngineSpec | str | None = None,
    console=None,
    env_extra: dict[str, str] | None = None,
    deadline: float | None = None,
    emit=None,
    progress_every: float = 10.0,
) -> CampaignSummary:
    """Run the campaign of ``config`` (its seed, its ``jobs`` libFuzzer
    workers, its libFuzzer flags, hand geometries or deployments) until
    ``deadline`` (``time.monotonic()``; default ``max_time`` from now),
    start-up included; return its summary. With ``console`` a live line is
    drawn; with ``emit`` (e.g. on a non-TTY) one progress line is passed to
    it every ``progress_every`` seconds.

    ``engine`` and ``other``: the typed engines (``kvspec fuzz`` parsed them
    at its edge; a bench's or test's name is read once here); each worker
    receives one as one serialized value (``EngineSpec.to_json``)."""
    engine = spec_of(engine, "engine")
    other = None if other is None else spec_of(other, "other")
    seed, jobs, libfuzzer_args, synthetic = config.seed, config.jobs, list(config.libfuzzer), config.synthetic
    started = time.monotonic()
    deadline = started + max_time if deadline is None else deadline
    origin = deadline - max_time  # the caller's start: progress counts from there
    stop_at = deadline - STOP_GRACE_S
    python, in_process = worker_python(engine, timeout=max(1.0, stop_at - time.monotonic()))
    corpus.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    env = target_env(engine, in_process)
    env.update(env_extra or {})
    env["KVSPEC_FUZZ_ENGINE"] = engine.to_json()
    env["KVSPEC_FUZZ_OUT"] = str(out)
    env["KVSPEC_FUZZ_SEED"] = str(seed)
    env["KVSPEC_FUZZ_PARENT"] = str(os.getpid())
    env["KVSPEC_FUZZ_DEADLINE"] = repr(time.time() + (stop_at - time.monotonic()) - 1.0)
    if other:
        env["KVSPEC_FUZZ_OTHER"] = other.to_json()
    if synthetic:
        env["KVSPEC_FUZZ_SYNTHETIC"] = "1"
        dirs = [str(corpus)] + ([str(seed_dir)] if seed_dir else [])
    else:
        # The workers map the z3 boundary cases onto real deployments (they
        # hold the engine that resolves them) into this folder, before
        # libFuzzer reads it.
        dirs = [str(corpus)]
        if seed_dir:
            mapped = seed_dir.parent / f"{seed_dir.name}-on-{engine.name.replace('==', '-')}"
            mapped.mkdir(parents=True, exist_ok=True)
            env["KVSPEC_FUZZ_Z3_SEEDS"] = str(seed_dir)
            env["KVSPEC_FUZZ_MAPPED_SEEDS"] = str(mapped)
            dirs.append(str(mapped))
    artifacts = out / "libfuzzer-artifacts"  # slow units and the like, never in the work tree
    artifacts.mkdir(parents=True, exist_ok=True)
    q: queue.Queue = queue.Queue()
    procs, states = [], []
    total = max(1, int(stop_at - time.monotonic()))  # an upper bound; the worker tightens it
    for j in range(jobs):
        if procs and time.monotonic() >= stop_at:  # nothing is started past the deadline
            break
        cmd = [
            python,
            str(TARGET),
            f"-seed={seed + j}",
            f"-max_total_time={total}",
            "-print_final_stats=1",
            "-timeout=120",
            "-rss_limit_mb=8192",
            f"-artifact_prefix={artifacts}/",
            *libfuzzer_args,
            *dirs,
        ]
        # Same process group as this runner (no new session): a kill of the
        # group reaches the workers; fuzz_engine also asks for PDEATHSIG.
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        states.append(WorkerState())
    for j, proc in enumerate(procs):  # threads only after every fork
        threading.Thread(target=_reader, args=(proc, j, q), daemon=True).start()

    live = _live(console)
    open_streams = len(procs)
    last_emit = origin
    try:
        while open_streams and time.monotonic() < stop_at:
            try:
                j, line = q.get(timeout=min(0.5, max(0.01, stop_at - time.monotonic())))
            except queue.Empty:
                line = ""
                j = -1
            if line is None:
                open_streams -= 1
            elif j >= 0:
                _parse(line, states[j])
            now = time.monotonic()
            if live:
                live.update(_progress(engine.name, states, now - started, in_process))
            if emit is not None and now - last_emit >= progress_every:
                last_emit = now
                emit(_progress_line(states, now - origin))
    except KeyboardInterrupt:
        pass
    finally:
        _stop(procs, states, wait_s=max(0.5, min(1.5, deadline - time.monotonic() - 0.5)))
        if live:
            live.stop()
    _drain(q, states)
    for proc, st in zip(procs, states):
        st.returncode = proc.returncode
    findings = sorted({(t, p, s) for st in states for (t, p, s) in st.findings})
    ended = time.monotonic()
    ready = [st.ready_at for st in states if st.ready_at is not None]
    fuzz_s = max(1e-9, ended - max(ready)) if ready else None
    return CampaignSummary(
        ATHERIS_KEYS,
        engine=engine.name,
        in_process=in_process,
        jobs=len(procs),
        elapsed_s=round(time.monotonic() - started, 2),
        execs=sum(st.execs for st in states),
        exec_per_s=sum(st.exec_s for st in states),
        engine_runs=sum(st.engine_runs for st in states),
        cases=sum(st.cases for st in states),
        # start-up (vLLM's import, the seeds mapped) apart from fuzzing;
        # the rates are per second of fuzzing, all workers together
        startup_s=round(max(ready) - started, 2) if ready else None,
        # the wall-clock time (time.time()) the last worker was ready: a
        # finding file's mtime minus this is its time from the engine ready
        ready_at=time.time() - (time.monotonic() - max(ready)) if ready else None,
        cases_per_s=round(sum(st.cases for st in states) / fuzz_s, 2) if fuzz_s else None,
        engine_runs_per_s=round(sum(st.engine_runs for st in states) / fuzz_s, 2) if fuzz_s else None,
        coverage=max((st.cov for st in states), default=0),
        unsupported=sum(st.unsupported for st in states),
        rejected=sum(st.rejected for st in states),
        harness_errors=sum(st.harness_errors for st in states),
        findings=[{"at_s": t, "path": p, "summary": s} for t, p, s in findings],
        first_finding_s=findings[0][0] if findings else None,
        duplicates=sum(st.duplicates for st in states),
        worker_exit_codes=[st.returncode for st in states],
        workers_died=sum(st.died for st in states),
        stopped_at_deadline=any(st.stopped for st in states),
        worker_tail=states[0].lines[-5:] if states else [],
    )


def _drain(q: queue.Queue, states: list[WorkerState]) -> None:
    """Parse what the stopped workers wrote last (final stats, a last
    finding line), waiting at most a fraction of a second."""
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        try:
            j, line = q.get(timeout=0.05)
        except queue.Empty:
            continue
        if line is not None:
            _parse(line, states[j])


def _progress_line(states: list[WorkerState], elapsed: float) -> str:

    found = len({p for s in states for (_, p, _) in s.findings})
    return progress_line(
        elapsed,
        sum(s.execs for s in states),
        sum(s.exec_s for s in states),
        max((s.cov for s in states), default=0) or None,
        found,
        sum(s.harness_errors for s in states),
    )


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
