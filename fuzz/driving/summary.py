"""A campaign's summary: the one type every campaign runner returns (one
campaign in this process, ``fuzz.driving.runner``; atheris's libFuzzer workers,
``fuzz.driving.atheris_runner``; N workers on Ray, ``fuzz.driving.ray_runner``), that Ray
workers' summaries are added up with (:meth:`CampaignSummary.merge`), that
gives ``kvspec fuzz`` its exit code (:meth:`CampaignSummary.outcome`), and
that is written as JSON (:meth:`CampaignSummary.to_dict`).

Each runner's JSON has its own keys, in its own order (``IN_PROCESS_KEYS``,
``ATHERIS_KEYS``, ``RAY_KEYS``, ``EMPTY_KEYS``): a summary carries the keys
it is written with, so ``to_dict`` writes exactly what that runner wrote
before this type existed, and ``from_dict`` reads any of them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from fuzz.driving.outcome import HARNESS_ERROR_LIMIT, outcome

#: What a local campaign ran and what the engine refused, in the order both
#: local runners write it (in process and atheris).
_PROGRESS_KEYS = (
    "cases",
    "startup_s",
    "ready_at",
    "cases_per_s",
    "engine_runs_per_s",
    "coverage",
    "unsupported",
    "rejected",
    "harness_errors",
)
#: One campaign in this process (``fuzz.driving.runner.run_in_process``).
IN_PROCESS_KEYS = (
    "engine",
    "driver",
    "elapsed_s",
    "execs",
    "exec_per_s",
    *_PROGRESS_KEYS,
    "cut_at_deadline",
    "duplicates",
    "workers_died",
    "findings",
    "first_finding_s",
    "reach",
    "case_files",
)
#: atheris's libFuzzer workers (``fuzz.driving.atheris_runner.run_atheris``).
ATHERIS_KEYS = (
    "engine",
    "in_process",
    "jobs",
    "elapsed_s",
    "execs",
    "exec_per_s",
    "engine_runs",
    *_PROGRESS_KEYS,
    "findings",
    "first_finding_s",
    "duplicates",
    "worker_exit_codes",
    "workers_died",
    "stopped_at_deadline",
    "worker_tail",
)
#: N campaign workers on Ray, added up (``fuzz.driving.ray_runner.run_on_ray``).
RAY_KEYS = (
    "engine",
    "driver",
    "ray",
    "jobs",
    "elapsed_s",
    "execs",
    "exec_per_s",
    "engine_runs",
    "cases",
    "coverage",
    "startup_s",
    "engine_runs_per_s",
    "cases_per_s",
    "unsupported",
    "rejected",
    "harness_errors",
    "duplicates",
    "workers_died",
    "findings",
    "first_finding_s",
    "case_files",
    "ray_tasks",
    "ray_retried",
    "ray_nodes",
)
#: A Ray worker started too close to the deadline to run anything.
EMPTY_KEYS = (
    "engine",
    "driver",
    "elapsed_s",
    "execs",
    "exec_per_s",
    "findings",
    "first_finding_s",
    "harness_errors",
    "unsupported",
    "rejected",
    "duplicates",
    "workers_died",
    "coverage",
)

#: The counts :meth:`CampaignSummary.merge` adds up (a missing one counts 0).
SUMMED = ("execs", "engine_runs", "cases", "unsupported", "rejected", "harness_errors", "duplicates", "workers_died")
#: The rates it adds up (the workers ran side by side).
RATES = ("exec_per_s", "engine_runs_per_s", "cases_per_s")


@dataclass
class CampaignSummary:
    """What a campaign did. ``keys``: the JSON keys it is written with, in
    order (one of the ``*_KEYS`` above, or what ``from_dict`` read); a field
    not among them is not written."""

    keys: tuple[str, ...]
    engine: str | None = None
    driver: str | None = None
    elapsed_s: float = 0.0
    #: Engine runs (in process; a case and its variants) or libFuzzer inputs (atheris).
    execs: int = 0
    exec_per_s: float = 0
    #: atheris: the campaign's engine runs (``execs`` are libFuzzer's inputs).
    engine_runs: int | None = None
    #: Cases checked.
    cases: int | None = None
    #: Seconds until the engine (the last worker) was ready; the rates below are per second after it.
    startup_s: float | None = None
    #: Wall-clock time (``time.time()``) the engine (the last worker) was ready.
    ready_at: float | None = None
    cases_per_s: float | None = None
    engine_runs_per_s: float | None = None
    #: libFuzzer's coverage (atheris), the best of the workers; None without atheris.
    coverage: int | None = None
    unsupported: int = 0
    rejected: int = 0
    harness_errors: int = 0
    cut_at_deadline: int | None = None
    duplicates: int = 0
    workers_died: int = 0
    #: This run's findings: ``{"path", "summary"}`` (atheris: with ``at_s`` first).
    findings: list[dict] = field(default_factory=list)
    first_finding_s: float | None = None
    #: ``fuzz.driving.reach.Reach.as_dict()``: deployment classes and trace shapes checked.
    reach: dict | None = None
    #: The ``--case`` files' accounting (``fuzz.driving.drivers.run_given``).
    case_files: dict | None = None
    # atheris
    in_process: bool | None = None
    jobs: int | None = None
    worker_exit_codes: list | None = None
    stopped_at_deadline: bool | None = None
    worker_tail: list | None = None
    # Ray
    ray: str | None = None
    ray_tasks: list | None = None
    ray_retried: int | None = None
    ray_nodes: list | None = None

    def __post_init__(self) -> None:
        unknown = [k for k in self.keys if k not in _FIELDS]
        if unknown:
            raise ValueError(f"CampaignSummary keys {unknown}: not fields of a campaign summary")

    def to_dict(self) -> dict:
        """The JSON the summary is written as: its ``keys``, in order."""
        return {k: getattr(self, k) for k in self.keys}

    @classmethod
    def from_dict(cls, data: dict) -> CampaignSummary:
        """A summary read back from its JSON (a Ray worker's); keys that are
        no field of a summary are left out."""
        keys = tuple(k for k in data if k in _FIELDS)
        return cls(keys=keys, **{k: data[k] for k in keys})

    def merge(self, *others: CampaignSummary) -> CampaignSummary:
        """This summary with ``others`` added to it, as Ray's workers are
        added up: the counts (``SUMMED``; a missing one counts 0) and the
        rates (``RATES``; the workers ran side by side) summed in order, the
        best coverage (None when none has any); every other field is this
        summary's."""
        counts = {k: int(getattr(self, k) or 0) for k in SUMMED}
        rates = {k: float(getattr(self, k) or 0) for k in RATES}
        coverage = self.coverage
        for other in others:
            for k in SUMMED:
                counts[k] += int(getattr(other, k) or 0)
            for k in RATES:
                rates[k] += float(getattr(other, k) or 0)
            if other.coverage is not None:
                coverage = max(coverage or 0, int(other.coverage))
        return replace(self, **counts, **rates, coverage=coverage)

    def outcome(self, limit: float = HARNESS_ERROR_LIMIT) -> tuple[int, str]:
        """``kvspec fuzz``'s exit code and its one-line reason
        (:func:`fuzz.driving.outcome.outcome`): this run's findings count as new."""
        return outcome(
            execs=self.execs,
            harness_errors=self.harness_errors,
            new_findings=len(self.findings),
            workers_died=self.workers_died,
            limit=limit,
            cases=self.case_files,
        )


_FIELDS = frozenset(f.name for f in fields(CampaignSummary)) - {"keys"}
