"""``python -m engine_adapter.inside.worker``: serve cases to the engine of this interpreter.

``--engine JSON``: the engine it serves, one serialized
``ground.engines.EngineSpec`` (``EngineSpec.to_json``: family, release,
build, patches), never a name or version key to parse again; without it,
the default family's driver with no release expected.

Runs inside an engine environment (``$KVSPEC_HOME/engines/vllm-X``) and
speaks :mod:`engine_adapter.protocol` on stdin/stdout. Before anything else
it moves the real stdout aside and points file descriptor 1 at stderr, so
whatever vLLM, torch or a C extension prints can never corrupt a protocol
line.

``--selftest`` instead runs one tiny MTP case and prints a JSON summary
(used by ``kvspec engines install`` before an environment is marked ready);
``--selftest --import-only`` only imports the modules kvspec drives (a
mutant's build: whether its first case runs is for kvspec's oracles to judge).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from engine_adapter.inside.handler import error, handle, response_line, settle
from engine_adapter.interface import family_module, get_driver
from engine_adapter.protocol import PROTOCOL_VERSION, decode, encode
from ground.engines import DEFAULT_FAMILY, EngineSpec
from ground.errors import KvspecError


def _claim_stdout():
    """Return a private text stream on the original stdout; fd 1 becomes stderr."""
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "w", buffering=1, encoding="utf-8")


def _hello(driver, t0: float) -> dict:
    return {
        "protocol": PROTOCOL_VERSION,
        "event": "hello",
        "engine": f"{driver.family}=={driver.version}",
        "vllm_version": driver.version,
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "import_s": round(time.perf_counter() - t0, 3),
    }


def serve(out, inp, family: str = "vllm") -> int:
    t0 = time.perf_counter()
    driver = get_driver(family)  # imports the engine
    settle()
    out.write(encode(_hello(driver, t0)))
    for line in inp:
        if not line.strip():
            continue
        rid = None
        try:
            msg = decode(line)
        except ValueError as e:
            resp = {"ok": False, "error": error("protocol", f"bad request line: {e}")}
        else:
            rid = msg.get("id")
            if msg.get("op") == "shutdown":
                out.write(encode({"id": rid, "ok": True, "result": {"bye": True}}))
                return 0
            resp = handle(driver, msg)
        out.write(response_line(resp, rid))
    return 0


def selftest(expect_version: str | None, out, *, import_only: bool = False, family: str = "vllm") -> int:
    """The family's self-test (its module's ``selftest``): import the stack
    and, unless ``import_only``, run one tiny case; a JSON summary on
    ``out``, exit 1 with one line on stderr when it fails."""
    return family_module(family).selftest(expect_version, out, import_only=import_only)  # imports the engine


def _engine(text: str) -> EngineSpec:
    """``--engine``'s value, read back (argparse: a bad one exits 2 with its line)."""
    try:
        return EngineSpec.from_json(text, "--engine")
    except KvspecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_adapter.inside.worker")
    parser.add_argument(
        "--engine",
        type=_engine,
        default=None,
        metavar="JSON",
        help="the engine served: a serialized EngineSpec (EngineSpec.to_json); default: the default family, any release",
    )
    parser.add_argument("--selftest", action="store_true")
    parser.add_argument(
        "--import-only", action="store_true", help="with --selftest: import vLLM and the driver, run no case"
    )
    parser.add_argument("--socket", help="serve as a warm engine on this Unix socket (engine_adapter.host.warm)")
    parser.add_argument("--state", help="with --socket: the state file to write")
    parser.add_argument(
        "--fingerprint", help="with --socket: the sources' fingerprint (engine_adapter.host.warm.fingerprint)"
    )
    parser.add_argument(
        "--idle-timeout", type=float, default=600.0, help="with --socket: exit after this many idle seconds"
    )
    args = parser.parse_args(argv)
    spec: EngineSpec | None = args.engine
    family = spec.family if spec is not None else DEFAULT_FAMILY
    if args.socket:
        from engine_adapter.inside.warm_server import serve_socket

        return serve_socket(args.socket, args.state, args.fingerprint or "", args.idle_timeout, family=family)
    out = _claim_stdout()
    if args.selftest:
        expect = spec.release if spec is not None else None
        return selftest(expect, out, import_only=args.import_only, family=family)
    return serve(out, sys.stdin, family=family)


if __name__ == "__main__":
    sys.exit(main())
