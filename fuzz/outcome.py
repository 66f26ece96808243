"""The verdict of a ``kvspec fuzz`` run as an exit code.

* ``EXIT_OK`` (0): the campaign ran and wrote no finding;
* ``EXIT_FINDINGS`` (1): it wrote at least one finding this run (a
  divergence already on file in ``--out`` is not reported again, so it does
  not count: a fresh ``--out`` counts everything);
* ``EXIT_USAGE`` (2): a bad option or input (``KvspecError``, one line);
* ``EXIT_HARNESS`` (3): the harness failed, so no verdict can be trusted:
  no execution at all, a fuzzing worker died, the engine environment is
  missing or unusable, or harness errors above the limit. It takes
  precedence over 1.
"""

from __future__ import annotations

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_HARNESS = 0, 1, 2, 3
#: Default ``--harness-error-limit``: the fraction of executions that may
#: end in a harness error before the run counts as a harness failure.
HARNESS_ERROR_LIMIT = 0.10
#: Fewer harness errors than this never fail a run (one flaky worker start
#: in a short campaign is not a broken harness).
HARNESS_ERROR_MIN = 3


def outcome(*, execs: int, harness_errors: int, new_findings: int, workers_died: int = 0, limit: float = HARNESS_ERROR_LIMIT, minimum: int = HARNESS_ERROR_MIN) -> tuple[int, str]:
    """(exit code, one-line reason). The harness failed when a worker died,
    when nothing was executed, or when harness errors number at least
    ``minimum`` and exceed ``limit`` times the executions; otherwise 1 when
    this run wrote a finding, else 0."""
    if workers_died:
        return EXIT_HARNESS, f"harness failed: {workers_died} fuzzing worker(s) died"
    if execs <= 0:
        return EXIT_HARNESS, "harness failed: no execution before the deadline (engine start-up takes ~20 s; is the engine usable?)"
    if harness_errors >= minimum and harness_errors > limit * execs:
        return EXIT_HARNESS, f"harness failed: {harness_errors} harness error(s) in {execs} execution(s), above the limit {limit:g}"
    if new_findings:
        return EXIT_FINDINGS, f"{new_findings} finding(s) written this run"
    return EXIT_OK, "ran; no finding"
