"""The ground floor: what every other package of kvspec uses, and which
imports none of them (tests/test_floors.py).

- :mod:`ground.engines`: the one grammar of engine names (``EngineSpec``)
  and the one registry of engine families (``FAMILIES``, ``Capability``);
- :mod:`ground.errors`: the one root error type and its one-line messages;
- :mod:`ground.files`: bounded reading of a stranger's JSON file, and the
  one atomic writer;
- :mod:`ground.home`: where kvspec keeps what it writes (``.kvspec/``) and
  the contained environment of every subprocess;
- :mod:`ground.console`: the one way to tell the user a line, and the
  console a command's tables print on (full width off a terminal);
- :mod:`ground.printable`: text made safe to print.
"""
