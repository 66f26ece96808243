"""Run a list of cases on the vLLM of *this* interpreter's environment, in
process, judging nothing: ``python -m mutate.replay_cases CASES.json``.

It exists for :mod:`mutate.coverage`, which runs it under ``coverage run``
in an engine environment: the cases a campaign ran, replayed, execute the
same vLLM code the campaign's engine did. vLLM is imported by
``engine_adapter`` (in-process engine), not here.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from engine_adapter.host.engine import open_engine
    from ground.errors import KvspecError
    from reference.case import parse_case

    (path, release) = argv
    engine = open_engine(f"vllm=={release}")
    ran = errors = 0
    for raw in json.loads(open(path).read()):
        try:
            engine.run(parse_case(raw))
            ran += 1
        except KvspecError:
            errors += 1
    print(json.dumps({"ran": ran, "refused": errors, "mode": engine.mode}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
