"""spec/: z3 proofs over block-geometry ranges, checked against ``reference/``.

The promise (issue 4), for a prompt of N tokens under sparse retention
(interval 0), with and without speculative decoding:

* **R1**: the Mamba state block that an identical resend's EAGLE-adjusted
  boundary lands on is one the retention rule keeps (so the first repeat
  hits at least that block, where dense retention would);
* **R2**: the same for the boundary a longer sibling resumes at.

Layout (same letters as ``reference/``: N, S, A, M, H, U, L):

* ``radix``: token counts as mixed-radix digits over ``S = m*u`` (the
  hand-linearised arithmetic: floors are digit truncations, carries are
  ``If``s; every query is linear, with no bounds on S, A, M or N);
* ``geometry``: geometry classes (uniform, aligned, partial, unitary; every
  geometry ``resolve_knobs`` supports is in one), serving modes (plain,
  EAGLE drop with either lookup ceiling, lookahead hashes), named geometries;
* ``rules``: the reference rules restated (``attention_lookup``, ``lookup``,
  ``replay_boundaries``, ``legacy_boundaries``, ``promise_boundaries``,
  ``kept_state``, ``chunk_end``, ``retained``, ``retention_mask``, ...);
* ``properties``: R1/R2 at three levels (``mask``: every state written;
  ``oneshot``: only prefill chunk ends are written; ``chunked``) and the
  other properties (chunked prefill, EAGLE off, unitary Mamba not shifted,
  no over-retention at interval 0, a sibling's length does not matter);
* ``catalogue``: every row with its expected verdict, written out by hand;
* ``solve``: seeded solvers with a timeout, vacuity check, verdicts
  proved / refuted / unknown / error;
* ``oracle`` and ``fidelity``: the reference's answers and the
  interval-splitting comparison; ``mutations``: planted slips, each caught;
* ``minimal``: minimal counterexamples (z3 Optimize) and their case files;
  ``sweep``: every S = 16k <= 4096 with every valid A, M; ``seeds``:
  ``boundary_cases()`` for the fuzzer.

Run: ``pytest spec/`` (``-m slow`` adds the one-shot rows, the full sweep and
the larger fidelity domain), ``kvspec prove [--json] [--sweep]``,
``python bench/spec.py``.

Findings (refuted rows; each minimal counterexample is replayed on the
reference serial model and becomes a case file for ``kvspec run``):

* replay proves R1 for every geometry whose hits land on S (uniform and
  aligned), unbounded; it refutes R1 with partial hash hits (A < M) under
  the 0.30.0 drop (A16/M32: N = 49) and for a single Mamba group with the
  drop (the lookup is not shifted, replay's marks are: M1600: N = 1601);
* legacy refutes R1 with the drop (N = 3201 at 1600, 3137 at 1568, 65 for
  both 32/16 mixes; 11910 is one counterexample);
* R2 without speculative decoding: replay and legacy keep floor((N-1)/S)*S
  only, so a longer sibling of a block-aligned prompt gets one block less
  than dense retention (N = S: 1600 at 1600);
* one-shot prefill (a state only where a chunk ends): replay under the
  0.30.0 drop misses N = 3S at 1600 (N = 4800), and every rule but the
  promise misses when M < A (the last cache position is aligned to M, hits
  to S).
"""
