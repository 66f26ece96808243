"""Where a warm engine lives and whether it still does: its private
folder (:func:`warm_dir`, :func:`private_dir`), its identity (the
environment it runs with, :func:`env_id`; the sources it runs,
:func:`fingerprint`), its files (:class:`Paths`), and its process (found by
pid and checked to be that server before any signal; a gone one's files
removed). The client that starts, queues on and kills warm engines is
:mod:`engine_adapter.host.warm`; its docstring states the rules."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import signal
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.host import environments
from engine_adapter.host.venvs import wait_flock
from engine_adapter.protocol import PROTOCOL_VERSION
from engine_adapter.sockets import remove_if
from ground.errors import invalid
from ground.files import hash_files
from ground.home import REPO_ROOT, kvspec_home

#: Default idle seconds before a warm engine exits by itself.
IDLE_TIMEOUT_S = 600.0
#: Seconds ``stop`` waits for each step (shutdown, SIGTERM) before the next.
STOP_WAIT_S = 10.0
#: Environment variables that are part of a warm engine's identity:
#: these prefixes and names (:func:`identity_env`) ...
IDENTITY_PREFIXES = (
    "VLLM_",
    "KVSPEC_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "PYTHON",
    "LD_",
)
IDENTITY_NAMES = ("HOME", "TMPDIR", "XDG_CACHE_HOME", "LANG", "LC_ALL", "TZ")
#: ... but for the warm engines' and the zygotes' own settings, read by
#: the client only (engine_adapter.host.zygote).
NOT_IDENTITY = (
    "KVSPEC_WARM",
    "KVSPEC_WARM_DIR",
    "KVSPEC_WARM_IDLE_S",
    "KVSPEC_ZYGOTE",
    "KVSPEC_ZYGOTE_DIR",
    "KVSPEC_ZYGOTE_IDLE_S",
    "KVSPEC_ZYGOTE_MAX",
)
#: Sources a warm engine runs: a change to any of them makes it stale.
FINGERPRINT_SOURCES = (
    "engine_adapter/**/*.py",
    "engine_adapter/models/**/*",
    "reference/**/*.py",
    "ground/**/*.py",
    "kvspec/__init__.py",
)


def enabled() -> bool:
    """Whether the commands use warm engines (``KVSPEC_WARM``, default on)."""
    return os.environ.get("KVSPEC_WARM", "1").strip().lower() not in ("0", "false", "no", "off")


def idle_timeout_default() -> float:
    """``KVSPEC_WARM_IDLE_S`` (seconds, > 0, at most a day), else :data:`IDLE_TIMEOUT_S`."""
    raw = os.environ.get("KVSPEC_WARM_IDLE_S")
    if raw is None or not raw.strip():
        return IDLE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise invalid("KVSPEC_WARM_IDLE_S", raw, "must be a finite number of seconds, 0 < S <= 86400")
    return value


def warm_dir() -> Path:
    """The folder asked for (``KVSPEC_WARM_DIR``, else ``$KVSPEC_HOME/warm``);
    the sockets live there or in its private subfolder (:func:`private_dir`)."""
    env = os.environ.get("KVSPEC_WARM_DIR")
    return Path(env).expanduser().resolve() if env else kvspec_home() / "warm"


def _dir_label(folder: Path) -> str:
    return "KVSPEC_WARM_DIR" if os.environ.get("KVSPEC_WARM_DIR") else "warm engine folder"


def _private_enough(st: os.stat_result) -> bool:
    """A folder of this user that neither group nor others can write."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def private_dir(folder: Path, create: bool = False) -> Path:
    """Where the warm engines of ``folder`` live. The rule: kvspec never
    chmods a folder it did not create. ``folder`` itself when it is missing
    (``create``: made 0700) or is a folder this user owns that neither
    group nor others can write; otherwise its subfolder
    ``kvspec-warm-<uid>`` (``create``: made 0700), used only if it is a real
    folder (not a link) of this user with no group or other access. Any
    other case is refused in one line (``InvalidArgument``)."""
    label = _dir_label(folder)
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        if not create:
            return folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # created here: never wider than 0700
        st = os.stat(folder)
    except OSError as e:
        raise invalid(label, str(folder), f"a folder kvspec can use ({e.strerror or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise invalid(label, str(folder), "a folder")
    if _private_enough(st):
        return folder
    sub = folder / f"kvspec-warm-{os.geteuid()}"
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(sub, 0o700)
    try:
        sst = os.lstat(sub)
    except FileNotFoundError:
        if not create:
            return sub
        raise invalid(
            label, str(folder), f"a folder where kvspec can create its private subfolder {sub.name}"
        ) from None
    if not (
        stat.S_ISDIR(sst.st_mode)
        and not stat.S_ISLNK(sst.st_mode)
        and sst.st_uid == os.geteuid()
        and not sst.st_mode & 0o077
    ):
        raise invalid(
            label,
            str(folder),
            f"a folder of yours that others cannot write, or one whose {sub.name} is a private folder of yours (yours, mode 0700, not a link)",
        )
    return sub


def identity_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that are part of a warm engine's identity
    (:data:`IDENTITY_PREFIXES`, :data:`IDENTITY_NAMES`, less :data:`NOT_IDENTITY`)."""
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(IDENTITY_PREFIXES) or k in IDENTITY_NAMES) and k not in NOT_IDENTITY
    }


def env_id(env: dict[str, str]) -> str:
    """12 hex digits of sha256 over :func:`identity_env` of ``env`` (names
    and values; only the hash is ever shown)."""
    h = hashlib.sha256(b"kvspec-warm-env\0")
    for k, v in sorted(identity_env(env).items()):
        h.update(k.encode(errors="surrogateescape") + b"=" + v.encode(errors="surrogateescape") + b"\0")
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Paths:
    """The files of one warm engine."""

    sock: Path
    state: Path
    log: Path
    lock: Path

    @classmethod
    def of(cls, version: str, platform: str, directory: Path | None = None, env: str | None = None) -> Paths:
        """The files of the warm engine of ``version`` on ``platform`` in
        the environment ``env`` (:func:`env_id`; default: the one this
        process would start it with), in ``directory``'s private folder."""
        if env is None:
            env = env_id(environments.worker_env(version, platform))
        return cls.named(private_dir(directory or warm_dir()) / f"vllm-{version}-{platform}-{env}")

    @classmethod
    def named(cls, base: Path) -> Paths:
        """``base`` + ``.sock`` / ``.json`` / ``.log`` / ``.lock``; a socket
        whose name would not fit a Unix socket address even through
        ``/proc/self/fd`` (a build's long label: ``engine_adapter.sockets.address``)
        is named by a digest of ``base``'s name instead."""
        paths = [base.with_name(base.name + ext) for ext in (".sock", ".json", ".log", ".lock")]
        if len(paths[0].name.encode()) > MAX_SOCKET_NAME:
            paths[0] = base.with_name(hashlib.sha256(base.name.encode()).hexdigest()[:24] + ".sock")
        return cls(*paths)


#: The longest socket file name kept as is: ``/proc/self/fd/NNNN/`` and the
#: name must fit the ~107 bytes of a Unix socket address.
MAX_SOCKET_NAME = 80


_FINGERPRINTS: dict[tuple, str] = {}


def fingerprint(version: str, platform: str, python: str | None = None) -> str:
    """sha256 of what a warm engine of ``version`` on ``platform`` runs:
    kvspec's engine-side sources (:data:`FINGERPRINT_SOURCES`), the
    environment's ready marker (rewritten by every install), the
    interpreter and the platform. Computed once per process."""
    python = python or str(environments.env_python(version))
    key = (version, platform, python)
    if key not in _FINGERPRINTS:
        h = hashlib.sha256(f"kvspec-warm\0{PROTOCOL_VERSION}\0{version}\0{platform}\0{python}\0".encode())
        hash_files(h, REPO_ROOT, FINGERPRINT_SOURCES)
        try:
            h.update(b"marker\0" + environments.marker_path(version).read_bytes())
        except OSError:
            h.update(b"no marker\0")
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


# ------------------------------------------------------------------ processes


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [x.decode(errors="replace") for x in raw.split(b"\0") if x]


def _proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``Z``: a zombie), None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    tail = raw[raw.rfind(b")") + 1 :].split()
    return tail[0].decode() if tail else None


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited and closed its files: no such process, or
    a zombie leader with no other thread left. A multithreaded process's
    leader shows ``Z`` as soon as it exits while its other threads still
    run their exit and hold the shared file table, the listening socket
    among it: a client connecting then is reset (seen in CI: the warm
    stand-in has two threads)."""
    state = _proc_state(pid)
    if state not in ("Z", "X"):
        return state is None
    try:
        return os.listdir(f"/proc/{pid}/task") in ([], [str(pid)])
    except OSError:
        return True


def _is_server(pid: object, sock: Path) -> bool:
    """Whether ``pid`` is alive and is the warm engine of ``sock`` (checked
    on its command line, so a reused pid is never signalled)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    cmd = _cmdline(pid)
    if not cmd or _proc_state(pid) in (None, "Z", "X"):
        return False  # gone or exiting: it serves no one
    return "engine_adapter.inside.worker" in cmd and "--socket" in cmd and str(sock) in cmd


def _wait_gone(pid: int, sock: Path, seconds: float) -> bool:
    """Wait until ``pid`` has exited (its files, the socket among them,
    closed: :func:`_exited`) or is no longer the server of ``sock``."""

    def gone() -> bool:
        if _exited(pid):
            return True
        cmd = _cmdline(pid)
        return bool(cmd) and not ("engine_adapter.inside.worker" in cmd and str(sock) in cmd)  # the pid was reused

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if gone():
            return True
        time.sleep(0.05)
    return gone()


def read_state(paths: Paths) -> dict | None:
    try:
        state = json.loads(paths.state.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _clean(paths: Paths, pid: int | None) -> None:
    """Remove a gone server's socket and state file (a live server's, or
    another server's, are left alone)."""
    state = read_state(paths)
    if state is not None and state.get("pid") == pid:
        if state.get("socket_inode") is not None:
            remove_if(paths.sock, state.get("socket_inode"))
        remove_if(paths.state)


def _kill(paths: Paths, pid: int, sig: int = signal.SIGKILL, wait_s: float = STOP_WAIT_S) -> bool:
    """Signal the warm engine ``pid`` of ``paths`` (only if it is one) and
    wait for it to go; clean its files. True when it is gone."""
    if _is_server(pid, paths.sock):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    gone = _wait_gone(pid, paths.sock, wait_s)
    if gone:
        _clean(paths, pid)
    return gone


@contextlib.contextmanager
def _locked(path: Path, deadline: float, label: str) -> Iterator[None]:
    """Hold the start lock of one warm engine (its folder made by
    :meth:`WarmClient.folder_ready`); wait (polling) until ``deadline``."""
    with open(path, "a") as f:
        wait_flock(
            f,
            deadline,
            0.1,
            f"{label}: warm engine start lock {path} held by another client past the time limit; allowed: a free lock",
        )
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _log_tail(paths: Paths) -> str:
    try:
        with open(paths.log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"
