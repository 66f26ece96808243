"""Checks of kvspec's stand-ins that need a real accelerator.

Nothing here runs in ``make test`` or ``make check``: each module is a script
run once, by hand, on a machine with the GPU it names, and its result is
committed under ``docs/data/`` (see ``docs/deployments.md``).
"""
