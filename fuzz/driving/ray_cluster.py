"""kvspec's Ray environment: where Ray keeps its files, how a driver joins or
starts a cluster (:class:`RaySession`) and a head started by hand
(:func:`start_head`, ``python -m fuzz.driving.distribute head``). Task running is
``fuzz.driving.distribute``'s; this module only sets Ray up.

Ray keeps its sessions, logs and sockets under ``$KVSPEC_HOME/ray``
(``RAY_TMPDIR``), never in ``/tmp/ray`` or ``~``; a cluster kvspec starts
uses Ray's token authentication with the token in
``$KVSPEC_HOME/ray/auth_token`` (0600; never printed), not ``~/.ray``. Ray's
Unix sockets (``<tmp>/session_<date>_<pid>/sockets/plasma_store``) must fit
in 107 bytes, which bounds the folder to :data:`MAX_TEMP_DIR` characters: a
longer ``$KVSPEC_HOME`` is refused in one line (workaround: a shorter
``KVSPEC_HOME``; kvspec never falls back to ``/tmp``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ground.errors import KvspecError, invalid
from ground.files import write_text_atomic
from ground.home import kvspec_home

#: Bound on reaching a cluster's address before ``ray.init``.
CONNECT_TIMEOUT_S = 5.0
#: Bound on ``ray.init`` connecting or starting a local cluster.
INIT_TIMEOUT_S = 60.0
#: Linux's limit on a Unix socket path (``sun_path``, 108 bytes with the NUL).
SOCKET_PATH_LIMIT = 107
#: What Ray appends to its temp folder for its longest socket (a session
#: name with a 7-digit pid).
_SOCKET_TAIL = "/session_2026-11-30_16-02-59_774033_4194304/sockets/plasma_store"
#: The longest Ray temp folder whose sockets fit.
MAX_TEMP_DIR = SOCKET_PATH_LIMIT - len(_SOCKET_TAIL)


def ray_temp_dir() -> Path:
    """Ray's folder: ``$KVSPEC_HOME/ray`` (what ``RAY_TMPDIR=$KVSPEC_HOME`` gives)."""
    return kvspec_home() / "ray"


def token_path() -> Path:
    return ray_temp_dir() / "auth_token"


def check_temp_dir(path: Path | None = None) -> Path:
    """The Ray folder, refused in one line when Ray's sockets under it would
    pass the 107-byte Unix socket limit."""
    path = Path(path or ray_temp_dir()).resolve()
    if len(str(path).encode()) > MAX_TEMP_DIR:
        raise invalid(
            "ray temp dir",
            str(path),
            f"Ray's Unix sockets under it must fit in {SOCKET_PATH_LIMIT} bytes: at most {MAX_TEMP_DIR} bytes; set KVSPEC_HOME to a shorter folder",
        )
    return path


def cluster_env(base: dict[str, str] | None = None, *, start: bool = False, loopback: bool = False) -> dict[str, str]:
    """The environment for Ray (a copy of ``base``, default ``os.environ``):
    ``RAY_TMPDIR`` = kvspec's home (Ray's folder is its ``ray/``), usage
    stats off, and the token file in kvspec's Ray folder unless the caller
    set ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH``. ``start``: for a
    cluster about to be started (``ray start --head``, ``"local"``): token
    authentication on (unless ``RAY_AUTH_MODE`` is set) and the token made
    when missing. Run ``ray start --head`` with this environment, and
    ``kvspec ... --ray auto`` finds it. ``loopback``: a one-node cluster
    on 127.0.0.1 (``"local"``, or an address on 127.0.0.1): Ray's servers
    listen on 127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's
    switch for single-machine clusters; without it Ray replaces 127.0.0.1 by
    the machine's address and listens on every interface)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("RAY_TMPDIR", str(kvspec_home()))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
    if "RAY_AUTH_TOKEN" not in env and "RAY_AUTH_TOKEN_PATH" not in env:
        env["RAY_AUTH_TOKEN_PATH"] = str(token_path())
    if loopback:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if env.get("RAY_AUTH_MODE") is None and (
        start or "RAY_AUTH_TOKEN" in env or Path(env.get("RAY_AUTH_TOKEN_PATH", "")).is_file()
    ):
        env["RAY_AUTH_MODE"] = "token"  # a token at hand: use it (Ray's connecting driver does not by itself)
    if env.get("RAY_AUTH_MODE") == "token" and "RAY_AUTH_TOKEN" not in env:
        path = Path(env["RAY_AUTH_TOKEN_PATH"])
        if start and not path.exists():
            write_text_atomic(path, secrets.token_hex(32))  # mkstemp: 0600
    return env


def _apply_env(env: dict[str, str]) -> dict[str, str | None]:
    before = {k: os.environ.get(k) for k in env if os.environ.get(k) != env[k]}
    os.environ.update(env)
    return before


def _restore_env(before: dict[str, str | None]) -> None:
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def resolve_address(address: str) -> str:
    """``"auto"`` or ``HOST:PORT`` -> ``HOST:PORT``, probed within
    ``CONNECT_TIMEOUT_S``; one line when there is none or it is unreachable."""
    given = address
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or ""
        if not address:
            file = ray_temp_dir() / "ray_current_cluster"
            address = file.read_text().strip() if file.is_file() else ""
        if not address:
            raise invalid(
                "--ray",
                given,
                f"no running cluster found (RAY_ADDRESS unset, no {ray_temp_dir() / 'ray_current_cluster'}); start one with `ray start --head` in kvspec's Ray environment (docs/distribute.md), or give HOST:PORT or 'local'",
            )
    if address.startswith("ray://"):
        raise invalid(
            "--ray",
            given,
            "Ray Client addresses (ray://) are not supported; give the cluster's GCS address HOST:PORT, 'auto' or 'local'",
        )
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise invalid("--ray", given, "must be 'local', 'auto' or a Ray cluster's GCS address HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise invalid(
            "--ray",
            given,
            f"must be a reachable Ray cluster: {host}:{port} did not answer within {CONNECT_TIMEOUT_S:g} s ({type(e).__name__})",
        )
    return f"{host}:{port}"


def _reload_ray_config() -> None:
    """Ray reads ``RAY_AUTH_MODE`` and the token when it is imported: after
    the variables change, make this process's Ray read them again (what
    Ray's own ``ray.init`` does when it makes a token)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # an older Ray without token authentication
        pass


def _enable_cluster(value: bool | None) -> bool | None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, at import, into
    ``ray_constants.ENABLE_RAY_CLUSTER``: set that constant in this process
    (``None``: leave it); return the value it had (to restore)."""
    if value is None:
        return None
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = value
    return before


def _ray_messages_to_stderr(restore=None):
    """Ray's driver prints the raylet's messages (a worker died, a task is
    retried) to stdout, where kvspec prints its JSON: send them to stderr
    (``restore``: put Ray's printer back). Returns Ray's printer."""
    try:
        from ray._private import worker
    except ImportError:
        return None
    if restore is not None:
        worker.print_to_stdstream = restore
        return None
    original = worker.print_to_stdstream

    def to_stderr(data, ignore_prefix):
        original({**data, "is_err": True}, ignore_prefix)

    worker.print_to_stdstream = to_stderr
    return original


class RaySession:
    """``with RaySession(address, num_cpus=N):`` Ray initialised in this
    process (started for ``"local"``, connected otherwise), shut down after
    unless it was already initialised. The Ray variables are set for the
    session and restored after."""

    def __init__(self, address: str, *, num_cpus: int | None = None):
        if address not in ("local", "auto") and ":" not in address:
            raise invalid("--ray", address, "must be 'local', 'auto' or a Ray cluster's GCS address HOST:PORT")
        if address == "local" and num_cpus is not None and num_cpus < 1:
            raise invalid("num_cpus", num_cpus, "must be at least 1")
        self.address, self.num_cpus = address, num_cpus
        self.owned = False
        self._env: dict[str, str | None] = {}
        self._cluster_flag: bool | None = None
        self._printer = None

    def __enter__(self):
        try:
            import ray
        except ImportError:
            raise invalid(
                "--ray", self.address, "needs Ray: pip install 'kvspec[dist]' (make venv installs it)"
            ) from None
        if ray.is_initialized():
            return self
        local = self.address == "local"
        target = None if local else resolve_address(self.address)
        temp = check_temp_dir()
        loopback = local or target.rpartition(":")[0] in ("127.0.0.1", "localhost", "::1", "[::1]")
        self._env = _apply_env(cluster_env(start=local, loopback=loopback))
        _reload_ray_config()
        self._cluster_flag = _enable_cluster(False if loopback else None)
        try:
            kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True)
            if local:
                temp.mkdir(parents=True, exist_ok=True)
                # address="local": a new cluster, never the one `ray start` left in ray_current_cluster
                ray.init(
                    address="local",
                    num_cpus=self.num_cpus or os.cpu_count() or 1,
                    _temp_dir=str(temp),
                    _node_ip_address="127.0.0.1",
                    **kwargs,
                )
            else:
                kwargs.pop("include_dashboard")
                ray.init(address=target, **kwargs)
        except Exception as e:  # Ray's own refusal (auth, version skew), as one line
            _restore_env(self._env)
            _enable_cluster(self._cluster_flag)
            if isinstance(e, KvspecError):
                raise
            raise invalid(
                "--ray",
                self.address,
                f"Ray could not {'start a local cluster' if local else 'connect'}: {type(e).__name__}: {' '.join(str(e).split())[:200]}",
            ) from None
        self.owned = True
        self._printer = _ray_messages_to_stderr()
        return self

    def __exit__(self, *exc):
        if self.owned:
            import ray

            ray.shutdown()
            self.owned = False
            if self._printer is not None:
                _ray_messages_to_stderr(restore=self._printer)
                self._printer = None
        _restore_env(self._env)
        self._env = {}
        _reload_ray_config()
        _enable_cluster(self._cluster_flag)
        self._cluster_flag = None


def start_head(*, port: int = 6379, num_cpus: int | None = None, loopback: bool = True, say=print) -> int:
    """``ray start --head --block`` in kvspec's Ray environment (its folder
    and token under ``$KVSPEC_HOME/ray``; ``loopback``: on 127.0.0.1 only),
    in a process group of its own; SIGINT/SIGTERM stop that group (SIGKILL)
    and nothing else (``ray stop`` would stop every Ray of this user on the
    machine). Returns ray's exit status."""
    check_temp_dir()
    env = cluster_env(start=True, loopback=loopback)
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        "--port",
        str(port),
        "--num-cpus",
        str(num_cpus or os.cpu_count() or 1),
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--block",
    ]
    if loopback:
        cmd += ["--node-ip-address", "127.0.0.1"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    address_file = ray_temp_dir() / "ray_current_cluster"

    def stop(*_):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:  # what `ray stop` does: --ray auto no longer names this head
            if address_file.read_text().strip().endswith(f":{port}"):
                address_file.unlink()
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    say(
        f"kvspec: Ray head {'127.0.0.1' if loopback else 'on this node'}:{port} (folder {ray_temp_dir()}, token {env.get('RAY_AUTH_TOKEN_PATH', 'RAY_AUTH_TOKEN')}); join with --ray auto; Ctrl-C stops it"
    )
    try:
        return proc.wait()
    finally:
        stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.driving.distribute", description="kvspec's Ray environment")
    sub = parser.add_subparsers(dest="what", required=True)
    env = sub.add_parser("env", help="print the Ray variables as shell exports (no secret: the token's path)")
    env.add_argument("--loopback", action="store_true", help="a one-node cluster on 127.0.0.1")
    head = sub.add_parser("head", help="start a Ray head in kvspec's environment until Ctrl-C")
    head.add_argument("--port", type=int, default=6379)
    head.add_argument("--num-cpus", type=int, default=None)
    head.add_argument(
        "--all-interfaces", action="store_true", help="reachable from other nodes (default: 127.0.0.1 only)"
    )
    args = parser.parse_args(argv)
    if args.what == "env":
        values = cluster_env({}, start=True, loopback=args.loopback)
        for key in sorted(values):
            print(f"export {key}={values[key]}")
        return 0
    try:
        return start_head(port=args.port, num_cpus=args.num_cpus, loopback=not args.all_interfaces)
    except KvspecError as e:
        print(f"kvspec: {e}", file=sys.stderr)
        return 2
