"""A TEST DOUBLE of an engine family: "toy" (issue 41, the family as a
plug-in). It stands in for an engine only in tests/test_engine_plugins.py,
which plugs it in by this one package plus one registry line
(``ground.engines.FAMILIES``) and runs ``predict``, ``run`` and a short
campaign on it. It is never a differential check of a real engine: its
"engine" is kvspec's own reference model under the promise."""
