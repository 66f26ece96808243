"""Hash units that straddle a kernel's checkpoint alignment.

A prefill kernel that exports internal Mamba checkpoints exports them only on
its own alignment. vLLM 0.33.0: FlashInfer's GDN prefill emits states every N
tokens, N a multiple of its 64-token chunk (``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``,
v1/attention/backends/gdn_attn.py:32-34); the resolved ``MambaSpec``'s
``prefill_checkpoint_alignment`` is then ``lcm(hash unit, 64)`` (or the block,
without a unit; ``reference.reachability``), and a chunk exports the checkpoint
only where its offset into the query is a multiple of that grid
(``is_mamba_prefill_checkpoint_valid``, v1/kv_cache_interface.py:1189-1210).
Mamba-2 layers export on a grid of one token (every unit lies on it).

So where the hash unit is finer than the resolved grid, a prompt's hash-unit
boundaries lie some on the grid and some off it: one deployment ends some
prefills at an internal checkpoint and others at a hash-unit tail
(scheduler.py:586-628: ``use_internal_checkpoint`` or ``tail_boundary``),
two paths of the scheduler and the Mamba manager that a deployment whose unit
is a multiple of the grid never mixes. Which deployments reach them depends on
the block (a GDN block off the 64 grid exports no checkpoint at all) and on
the unit, so a campaign drawing units and blocks uniformly reaches a unit
class's mixed paths in about one deployment in four.

The generator therefore reads the grid from the engine's own resolution (the
campaign resolver's ``checkpoint_grid``, ``geometry.prefill_checkpoint_grid``),
never from a model's name or a known trace: a deployment class that pins a
hash unit prefers a deployment whose resolved grid a unit can straddle, and
then a unit that does (among the values a user may set: every multiple of
the kernel block that divides the block, on the grid and off it). A seeded
campaign (``fuzz.driving.drivers.random_cases``) notes the models whose
deployments it saw straddle, and its class schedule
(``fuzz.draw.generate.class_schedule``) visits their unit classes once more
every :data:`FAVOUR_EVERY` deployments.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.draw.choosers import Chooser

#: The finest unit drawn: the smallest kernel block of the CUDA attention
#: backends (``reference.reachability.KERNEL_GRID``), which every block is a multiple of.
UNIT_STEP = 16
#: Units tried (each one resolution, cached per deployment) before the drawn one stays.
TRIES = 3
#: One deployment in this many is a favoured class (a unit class of a model
#: seen to straddle), beside the schedule's round of every class.
FAVOUR_EVERY = 4


def user_units(block: int) -> list[int]:
    """The ``--prefix-match-unit`` values a user may set on ``block``: every
    multiple of :data:`UNIT_STEP` below the block that divides it (16, 32, 48,
    80, ...: on a kernel's checkpoint grid and off it)."""
    return [u for u in range(UNIT_STEP, block, UNIT_STEP) if block % u == 0]


def may_straddle(info: dict | None) -> bool:
    """Whether a resolved deployment (no unit set) exports internal
    checkpoints on a grid coarser than the finest unit: then some unit can
    lie off it."""
    grid = (info or {}).get("checkpoint_grid")
    return isinstance(grid, int) and grid > UNIT_STEP


def settled(info: dict | None) -> bool:
    """Whether a unit class need draw no other deployment: the resolution
    exports checkpoints, on a coarse grid (:func:`may_straddle`) or on a grid
    every unit lies on (Mamba-2's one token: no deployment of that model
    straddles, so another draw would only cost a resolution)."""
    return isinstance((info or {}).get("checkpoint_grid"), int)


def straddles(unit: int | None, info: dict | None) -> bool:
    """Whether ``unit`` is finer than the checkpoint grid the engine resolved
    with it (``info``: the resolution of the deployment with that unit)."""
    grid = (info or {}).get("checkpoint_grid")
    return unit is not None and isinstance(grid, int) and unit < grid


def straddling_unit(c: Chooser, unit: int, block: int, resolve: Callable[[int], dict | None]) -> tuple[int, bool]:
    """``(unit, True)`` when the engine resolves ``unit`` finer than its
    checkpoint grid; else the first of up to :data:`TRIES` drawn
    :func:`user_units` that is (``resolve(u)``: the deployment resolved with
    unit ``u``, or None where the engine refuses it); else ``(unit, False)``."""
    if straddles(unit, resolve(unit)):
        return unit, True
    candidates = user_units(block)
    for _ in range(TRIES if candidates else 0):
        u = c.choice(candidates)
        if straddles(u, resolve(u)):
            return u, True
    return unit, False
