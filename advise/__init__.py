"""``kvspec advise``: what a deployment will hit on a workload, before it ships.

* :mod:`advise.workloads`: the built-in workload shapes (deterministic,
  seeded) and recorded traces (JSON lines), as the requests of a case;
* :mod:`advise.model`: the reference model's answers for one resolved
  geometry: per-request hits under the implemented rule and the promise,
  the minimum cacheable prefix, the failure classes, the retention sweep,
  the memory of the Mamba states kept and the recommendation (imports only
  ``reference``);
* :mod:`advise.source`: where the geometry comes from: a deployment resolved
  by an engine (cached on disk), or a live server's ``/metrics``;
* :mod:`advise.confirm`: the same numbers on the real engine, and a
  ``reference`` finding for every disagreement;
* :mod:`advise.chart`, :mod:`advise.render`: the PNG chart and the printout.
"""
