"""spec/: z3 proofs over block-geometry ranges, checked against ``reference/``.

The promise (issue 4), for a prompt of N tokens under sparse retention
(interval 0), with and without speculative decoding:

* **R1**: the Mamba state block that an identical resend's EAGLE-adjusted
  boundary lands on is one the retention rule keeps (so the first repeat
  hits at least that block, where dense retention would);
* **R2**: the same for the boundary a longer sibling resumes at;

and at junctions (issue 10): a sibling that diverges inside an earlier prompt
is promised a hit at the divergence point only once that junction has been
observed:

* **junction-observed**: a request whose lookup reached the attention
  junction J with no Mamba state splits its prefill at J, so the state a
  later sibling diverging at J needs (T = floor_to(J, M)) is written and
  kept, under sparse, periodic and dense retention, one-shot or chunked;
* **junction-unobserved**: before that, the promise keeps the state at a
  divergence point only if a prefill chunk ended there (on the Mamba grid)
  or it is one of its own boundaries: it no longer assumes every Mamba block
  written (0/0/640 for three siblings diverging at 700 at block 128, as
  vLLM, not 0/640/640).

Layout (same letters as ``reference/``: N, S, A, M, H, U, L):

* ``radix``: token counts as mixed-radix digits over ``S = m*u`` (the
  hand-linearised arithmetic: floors are digit truncations, carries are
  ``If``s; every query is linear, with no bounds on S, A, M or N);
* ``geometry``: geometry classes (uniform, aligned, partial, hashed,
  unitary; every geometry ``resolve_knobs`` supports that a deployment can
  build is in one), serving modes (plain, EAGLE drop with either lookup
  ceiling, lookahead hashes), named geometries (issue 4's and the
  deployments of issue 9: Qwen3-Next on an A100 at 544 with a prefix match
  unit of 16 or 32, on an H100 at 576 and 576/32);
* ``rules``: the reference rules restated (``attention_lookup`` with the
  partial-tail probe, ``fa_tail``, ``lookup``, ``replay_boundaries``,
  ``legacy_boundaries``, ``promise_boundaries``, ``kept_state``,
  ``chunk_anchors``, ``chunk_end``, ``retained``, ``retention_mask``, ...);
* ``properties``: R1/R2 at three levels (``mask``: every state written;
  ``oneshot``: only prefill chunk ends are written; ``chunked``), the
  junction properties (one-shot and chunked, sparse / periodic / dense) and
  the other properties (chunked prefill, EAGLE off, unitary Mamba not
  shifted, no over-retention at interval 0, a sibling's length does not
  matter);
* ``catalogue``: every row with its expected verdict, written out by hand,
  and the tiers (the default sample, ``kvspec prove``, ``--all``);
* ``solve``: seeded solvers with a timeout, vacuity check, verdicts
  proved / refuted / unknown / error (a nonlinear row is built in a fresh
  z3 context, so its verdict does not depend on what ran before it);
* ``oracle`` and ``fidelity``: the reference's answers and the
  interval-splitting comparison (R1/R2 over N; the junction properties over
  N and J), and every restated term at concrete N (boundaries, tails, chunk
  ends, kept states); ``mutations``: planted slips, each caught (by a row,
  or where no row can see it, by the term comparison);
* ``minimal``: minimal counterexamples (z3 Optimize) and their case files;
  ``sweep``: every S = 16k <= 4096 with every valid A, M (and every hash
  unit H = 16k below S for hashed); ``seeds``: ``boundary_cases()`` for the
  fuzzer (issue 4's named geometries).

Run: ``pytest spec/`` (the default tier, seconds: a representative sample of
rows, the verdict machinery, a small fidelity sample); ``pytest spec/ --slow``
(or ``-m slow``) runs everything: every row, the larger fidelity domain, the
full sweep. ``kvspec prove [--json] [--sweep] [--all]`` runs the catalogue
(``--all``: also chunked prefill per rule and the chunked junction rows);
``python bench/spec.py`` times them.

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
  to S);
* junctions: replay and legacy keep the state a sibling needs after an
  observed junction on uniform and aligned geometries (J is on the Mamba
  grid), under every retention; with partial hash hits (A < M) a junction
  off the Mamba grid writes no state at T = floor_to(J, M) (A16/M32, three
  siblings diverging at 50: replay hits 0/0/0 where T = 32; the reference
  serial model agrees), the promise keeps J itself.
* hashed (issue 9: attention = Mamba = B above the hash unit H, vLLM's
  align-mode layout with ``--prefix-match-unit``; full attention matches
  whole blocks, then the prompt's own partial tail within the next block,
  one hash unit of margin and drop under the EAGLE drop): the verdicts of
  the partial class. An identical resend lands on the prompt's checkpoint
  (f_H(N-1) without the drop, f_H(N) - H with it), which vLLM keeps from
  0.32.0 on: R1 proved except under the 0.30.0 drop, which refuses a
  checkpoint on the block grid (544/16: N = 561, the resend needs 544,
  replay keeps nothing there). R2 without speculative decoding: a longer
  sibling of a block-aligned prompt resumes at N under dense retention;
  sparse keeps N - H and N - B (544/16, 0.33.0: N = 544, the sibling hits
  528). One-shot, 0.30.0 without speculation: N = 2B is one chunk, nothing
  kept (544/32: N = 1088). Junctions: vLLM splits the prefill at
  floor_to(J, B), which every rule marks: proved (the sibling then hits
  that block, not J; the promise keeps J).

Left out of the encoding (the rules are the reference's with these off):
internal prefill checkpoints (``prefill_checkpoint_grid``: vLLM 0.33.0's
FlashInfer GDN prefill on Hopper exports the prompt's checkpoint from
inside the last chunk and drops the other stops; a grid relative to the
chunk start would need a symbolic divisor, and the chunk start is itself a
symbolic multiple of the budget) and the shared-prefix checkpoint. On the
named H100 geometries the reference's R1/R2 and junction-observed truth is
the same with the checkpoints (``spec.test_fidelity``). The geometries
``resolve_knobs`` supports outside every class are hand geometries no
deployment builds: two block sizes with a hash unit below both.
"""
