"""What one campaign takes from ``kvspec fuzz``'s flags, parsed once at
the command's edge and handed to whichever driver runs it (in this process,
atheris's libFuzzer workers, or Ray's tasks: each task carries its fields
and reads them back into one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunConfig:
    """The driver (``random``, ``hypothesis``, ``cases``, ``atheris``), its
    seed, whether it draws hand geometries instead of deployments, whether
    the random driver's deployments carry a KV connector
    (``fuzz.draw.generate.CONNECTOR_MODES``) and what block pool
    (``fuzz.draw.generate_pressure.PRESSURE_MODES``), how many workers run
    it (atheris's libFuzzer processes, Ray's tasks: worker j takes seed
    ``seed + j``), and libFuzzer's own flags (atheris)."""

    driver: str
    seed: int
    synthetic: bool = False
    connector: str = "drawn"
    pressure: str = "drawn"
    jobs: int = 1
    libfuzzer: tuple[str, ...] = ()
