"""``kvspec mutate``: how strong is kvspec? Mutation score on vLLM's own
boundary code, set beside vLLM's own tests (issue 12).

One job per module:

* :mod:`mutate.targets`: which vLLM functions are mutated (their line
  ranges, read from the release's source text, never imported);
* :mod:`mutate.generate`: the mutants, made with Cosmic Ray's operators,
  each a unified diff against the release's ``vllm/`` tree;
* :mod:`mutate.vllm_tests`: vLLM's own ``tests/v1/core`` from the sdist,
  run with pytest inside an engine environment;
* :mod:`mutate.kill`: one mutant, one task (``run_mutant``): its build,
  kvspec's kill (``fuzz.replaying.checkbuild``), vLLM's tests' kill;
* :mod:`mutate.equivalent`: the reviewed list of equivalent mutants and the
  check that a survivor changes no observation;
* :mod:`mutate.run`: the loop over mutants (here, or on Ray via
  ``fuzz.driving.distribute``);
* :mod:`mutate.report`: the table (markdown, JSON) and the PNG;
* :mod:`mutate.coverage`: branch coverage of the target functions under a
  campaign and under vLLM's tests.

Nothing here imports vLLM: everything vLLM-side runs as a subprocess in an
engine environment (``engine_adapter``).
"""
