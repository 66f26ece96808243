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

``--case`` files are accounted for one by one (``fuzz.driving.drivers.run_given``):
a campaign that did not run every given file to completion (one cut at the
deadline, one the harness failed on, one never started) never says "no
finding": without a finding it exits 3 with one line naming how many and
which; a finding written still gives 1 (the line names them too).
"""

from __future__ import annotations

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_HARNESS = 0, 1, 2, 3
#: Default ``--harness-error-limit``: the fraction of executions that may
#: end in a harness error before the run counts as a harness failure.
HARNESS_ERROR_LIMIT = 0.10
#: Fewer harness errors than this never fail a run (one flaky worker start
#: in a short campaign is not a broken harness).
HARNESS_ERROR_MIN = 3


def outcome(
    *,
    execs: int,
    harness_errors: int,
    new_findings: int,
    workers_died: int = 0,
    limit: float = HARNESS_ERROR_LIMIT,
    minimum: int = HARNESS_ERROR_MIN,
    cases: dict | None = None,
) -> tuple[int, str]:
    """(exit code, one-line reason). The harness failed when a worker died,
    when nothing was executed, or when harness errors number at least
    ``minimum`` and exceed ``limit`` times the executions; otherwise 1 when
    this run wrote a finding; otherwise 3 when a ``--case`` file was not run
    to completion (``cases``: ``run_given``'s accounting), else 0."""
    left = unfinished_line(cases)
    tail = f"; {left}" if left else ""
    if workers_died:
        return EXIT_HARNESS, f"harness failed: {workers_died} fuzzing worker(s) died{tail}"
    if execs <= 0:
        return (
            EXIT_HARNESS,
            f"harness failed: no execution before the deadline (engine start-up takes ~20 s; is the engine usable?){tail}",
        )
    if harness_errors >= minimum and harness_errors > limit * execs:
        return (
            EXIT_HARNESS,
            f"harness failed: {harness_errors} harness error(s) in {execs} execution(s), above the limit {limit:g}{tail}",
        )
    if new_findings:
        return EXIT_FINDINGS, f"{new_findings} finding(s) written this run{tail}"
    if left:
        return EXIT_HARNESS, f"harness failed: {left}"
    return EXIT_OK, "ran; no finding"


#: How an unfinished ``--case`` file is named in the outcome line.
_WHY = {"cut_at_deadline": "cut at the deadline", "harness_error": "a harness error", "not_started": "not started"}


def unfinished_line(cases: dict | None, shown: int = 5) -> str:
    """ "N of M --case file(s) not run to completion: a.json (cut at the
    deadline), ..." (the first ``shown`` named; a name with a control
    character shown escaped, as repr), or "" when all ran."""
    if not cases or not cases.get("unfinished"):
        return ""
    items = cases["unfinished"]
    named = ", ".join(f"{_shown(str(u['path']))} ({_WHY.get(u['why'], u['why'])})" for u in items[:shown])
    more = f", and {len(items) - shown} more" if len(items) > shown else ""
    return f"{len(items)} of {cases['given']} --case file(s) not run to completion: {named}{more}"


def _shown(name: str) -> str:
    return name if name.isprintable() else repr(name)
