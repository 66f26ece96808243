"""The effective knobs a vLLM scheduler runs with, resolved from a case.

Five numbers decide every prefix-cache boundary in this model:

* ``eagle_drop``: the KV cache manager drops the last matched attention block
  of a hit (vLLM's ``use_eagle`` as the coordinator sees it). EAGLE, EAGLE3
  and MTP drafters need it (``ngram``, with no drafter KV, does not); ``disable_eagle_block_drop`` turns it off
  (0.30.0+); lookahead block hashes replace it (0.33.0: ``use_eagle`` is
  cleared when ``num_hash_lookahead_tokens > 0``).
* ``tail_checkpoint``: with partial hash hits, where the prompt's own
  partial-tail state is kept (``boundaries.tail_checkpoint``: ``floor`` in
  0.29.0, ``floor_drop`` in 0.30.0, ``checkpoint`` from 0.32.0).
* ``junction_back_off``: 0.33.0's ``MambaManager.cache_blocks`` also keeps
  the state one block below a shared-prefix junction, but only in a Mamba
  manager of an EAGLE group; vLLM flags the draft layer's (attention) group,
  so it never fires for the models it serves (always False here).
* ``hash_lookahead_tokens``: tokens after each hash block that its hash also
  covers (0.33.0 ``VllmConfig.num_hash_lookahead_tokens``: 1 for EAGLE and
  single-module MTP when the drop would otherwise be in force, unless
  ``disable_lookahead_block_hashes``; 0.29.0 to 0.32.0 have none).
* ``alignment``: the unit hits land on (``_cache_hit_alignment_tokens``): the
  hash block when partial hash hits are on (an align-mode Mamba group whose
  block is larger than the hash block), else the scheduler block. Full
  attention then matches whole blocks plus one earlier prompt's partial tail
  (``fa_tail``), reads one hash unit past the candidate and drops one.
* ``hit_cap``: a request of N prompt tokens can hit at most N-1 tokens (its
  last token is recomputed for logits; ``get_computed_blocks``).
* ``eagle_lookup_ceiling``: how far past the candidate the EAGLE attention
  lookup may match before it drops a block: ``"n_minus_1"`` (0.29.0, 0.30.0:
  ``min(candidate + margin, N-1)``) or ``"hashed"`` (0.33.0:
  ``min(candidate + margin, hashed length)``; 0.32.0 too). They differ only
  on prompts whose length is a multiple of the scheduler block.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ground.engines import DEFAULT_FAMILY, FAMILIES, Capability, EngineSpec, engine_key, family_of, load
from ground.errors import KvspecError, Unsupported, invalid
from reference.case import EAGLE_METHODS, Case, require_geometry

#: Versions whose knob resolution this model states; others are unsupported
#: (the registry's: ``ground.engines.FAMILIES``).
SUPPORTED_VERSIONS = FAMILIES["vllm"].releases
#: SGLang releases the promise is stated for (``sglang==X``; :func:`sglang_knobs`).
SGLANG_VERSIONS = FAMILIES["sglang"].releases
DEFAULT_VERSION = FAMILIES[DEFAULT_FAMILY].default_release


@dataclass(frozen=True)
class Knobs:
    version: str
    eagle_drop: bool
    hash_lookahead_tokens: int
    scheduler_block_size: int
    hash_block_size: int
    alignment: int
    partial_hash_hits: bool
    eagle_lookup_ceiling: str
    junction_back_off: bool
    tail_checkpoint: str
    #: Has this version ``replay_boundaries`` (0.30.0+)? Informational.
    has_replay_boundaries: bool
    #: Where a prompt's full-attention partial tail is keyed, with partial
    #: hash hits (``FullAttentionManager._cache_partial_tail_block``):
    #: ``n`` (0.29.0, 0.30.0: floor(N/H)*H), ``cap`` (0.32.0: N under the
    #: drop, else N-1, floored to H), ``cap_hashed`` (0.33.0: the same,
    #: capped at the hashed length).
    fa_tail: str = "cap_hashed"
    #: Internal Mamba prefill checkpoints in force (the geometry's grid; 0.32.0+).
    prefill_checkpoint_grid: int | None = None
    #: ``--enable-mamba-shared-prefix-checkpoint`` in force (needs an EAGLE
    #: group, partial hash hits and single-module MTP; 0.32.0+).
    shared_prefix_checkpoint: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def parse_version(text: str | EngineSpec) -> str:
    """Accept ``0.33.0`` or ``vllm==0.33.0``; return ``0.33.0``; another
    family's ``sglang==X`` is returned as it is (its version key). A build of
    a release (a PEP 440 local version, ``0.33.0+fix.1a2b3c``: a patched
    engine) is that release: the model states the rule the release
    implements. The name is read by the one grammar
    (``ground.engines.EngineSpec``); an engine parsed already is not read again."""
    if isinstance(text, EngineSpec):
        return text.release_spec.version
    try:
        spec = EngineSpec.parse(text, "version")
    except KvspecError:
        name = family_of(text) if isinstance(text, str) and family_of(text) in FAMILIES else DEFAULT_FAMILY
        raise invalid(
            "version", text, f"supported: {', '.join(f'{name}==' + v for v in FAMILIES[name].releases)}"
        ) from None
    return spec.release_spec.version


def implemented_rule(version: str | EngineSpec) -> str:
    """The retention rule vLLM ``version`` implements: ``legacy`` before
    0.30.0 (which added ``replay_boundaries``), ``replay`` from 0.30.0. A
    version string that does not parse (a server's local build) counts as
    newer. SGLang (``sglang==X``) has no rule of its own in the model:
    it is held to the promise. The typed engine is read as it is."""
    version = engine_key(version)
    family = FAMILIES.get(family_of(version))
    if family is not None and not family.supports(Capability.RULE_MODEL):
        return "promise"
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return "replay"
    return "legacy" if major_minor < (0, 30) else "replay"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def partial_hash_hits(case: Case) -> bool:
    """0.29.0+ ``partial_hash_hits_enabled``: some align-mode Mamba group has
    a block larger than the hash block (full attention supports the finer
    lookup, so it never vetoes)."""
    g = case.geometry
    return any(m > g.hash_block_size for m in g.mamba_block_sizes)


def sglang_knobs(case: Case, version: str) -> Knobs:
    """The knobs the promise reads for an SGLang deployment (SGLang 0.5.23,
    the geometry ``engine_adapter.sglang_engine.resolve`` states): hits
    capped at N-1 (``schedule_batch.py _compute_max_prefix_len``), no EAGLE
    block drop and no lookahead hashes (a hybrid tree keys raw tokens:
    ``unified_tree_core.py`` clears ``is_eagle`` when MAMBA is a
    component), and full attention and Mamba states both on the geometry's
    block: the checkpoint grid, where the extra buffer tracks a state (the
    resolver states no geometry where the promise does not hold)."""
    g = require_geometry(case)
    if case.speculative is not None:
        raise Unsupported("speculative: SGLang's speculative decoding is not in this model; allowed: none")
    partial = partial_hash_hits(case)
    return Knobs(
        version=version,
        eagle_drop=False,
        hash_lookahead_tokens=0,
        scheduler_block_size=g.scheduler_block_size,
        hash_block_size=g.hash_block_size,
        alignment=g.hash_block_size if partial else g.scheduler_block_size,
        partial_hash_hits=partial,
        eagle_lookup_ceiling="hashed",
        junction_back_off=False,
        tail_checkpoint="checkpoint",
        has_replay_boundaries=False,
        fa_tail="cap_hashed",
    )


def unstated_knobs(case: Case, version: str) -> Knobs:
    """A family whose cache the promise's knobs do not describe (llama.cpp's
    context checkpoints: ``reference.llamacpp`` states its rule): one line."""
    raise Unsupported(
        f"engine={version}: its cache is judged by its own rule, not by the promise's knobs; allowed: a vLLM or SGLang engine"
    )


def resolve_knobs(case: Case, version: str | EngineSpec = DEFAULT_VERSION) -> Knobs:
    """Resolve the knobs of ``case`` the way vLLM ``version`` does (or,
    for ``sglang==X``, as :func:`sglang_knobs` states them): the family's
    knobs resolver, named by its registry entry (``ground.engines``)."""
    version = parse_version(version)
    return load(FAMILIES[family_of(version)].knobs)(case, version)


def vllm_knobs(case: Case, version: str) -> Knobs:
    """The knobs of ``case`` as vLLM ``version`` (a parsed release) resolves them."""
    v = _version_tuple(version)
    g = require_geometry(case)
    spec = case.speculative
    partial = partial_hash_hits(case)
    alignment = g.hash_block_size if partial else g.scheduler_block_size
    if g.num_groups == 1:
        # UnitaryKVCacheCoordinator: hits land on the single group's block.
        alignment = g.scheduler_block_size
        partial = False

    eagle_drop = False
    lookahead = 0
    if spec is not None:
        # mtp, eagle, eagle3 need the EAGLE block drop; ngram (no drafter KV) never
        wants_drop = spec.method in EAGLE_METHODS
        if spec.option("disable_eagle_block_drop"):
            if v < (0, 30, 0):
                raise Unsupported(
                    f"speculative.disable_eagle_block_drop=True: not an option in vLLM {version} (added in 0.30.0)"
                )
            wants_drop = False
        if v >= (0, 33, 0):
            if wants_drop and not spec.option("disable_lookahead_block_hashes"):
                lookahead = 1  # single-module MTP and EAGLE read one token ahead
        elif spec.options.get("disable_lookahead_block_hashes") is False:
            raise Unsupported(
                f"speculative.disable_lookahead_block_hashes=False: vLLM {version} has no lookahead block hashes"
            )
        eagle_drop = wants_drop and lookahead == 0
        if eagle_drop and spec.method == "mtp" and spec.num_speculative_tokens > g.scheduler_block_size:
            raise Unsupported(
                f"speculative.num_speculative_tokens={spec.num_speculative_tokens}: must not exceed scheduler_block_size={g.scheduler_block_size}"
            )
    if g.prefix_match_unit is not None and g.num_groups == 1 and g.prefix_match_unit != g.scheduler_block_size:
        raise invalid(
            "geometry.prefix_match_unit",
            g.prefix_match_unit,
            f"with a single KV cache group must be unset or equal to the block size {g.scheduler_block_size}",
        )
    if g.scheduler_block_size != math.lcm(*(x.block_size for x in g.groups)):
        raise Unsupported(
            f"geometry.scheduler_block_size={g.scheduler_block_size}: vLLM {version} always uses the LCM of the group block sizes"
        )
    for a in g.attention_block_sizes:
        if a > alignment and (not partial or a % g.hash_block_size):
            raise Unsupported(
                f"full_attention block_size={a} above the hit alignment {alignment}: outside this model (allowed: partial hash hits with the hash block dividing it)"
            )
    grid = g.prefill_checkpoint_grid
    if grid is not None and v < (0, 32, 0):
        raise Unsupported(
            f"geometry.prefill_checkpoint_grid={grid}: vLLM {version}'s internal checkpoints (Kimi KDA only) follow another rule; allowed: null before 0.32.0"
        )
    shared_ckpt = False
    if g.shared_prefix_checkpoint:
        if v < (0, 32, 0):
            raise Unsupported(
                f"geometry.shared_prefix_checkpoint=true: not an option of vLLM {version} (0.32.0+; 0.30.0 had --enable-mamba-fine-grained-prefix-cache)"
            )
        # KVCacheManager: only with an EAGLE group (a drafter's KV layer:
        # not ngram's; lookahead hashes keep the group flagged), partial hash hits
        # and no multi-module MTP re-prefill.
        # (vLLM flags the drafter's group only under use_eagle_block_drop:
        # not with disable_eagle_block_drop)
        shared_ckpt = (
            spec is not None
            and spec.method in EAGLE_METHODS
            and not spec.option("disable_eagle_block_drop")
            and partial
        )
    return Knobs(
        version=version,
        eagle_drop=eagle_drop,
        hash_lookahead_tokens=lookahead,
        scheduler_block_size=g.scheduler_block_size,
        hash_block_size=g.hash_block_size,
        alignment=alignment,
        partial_hash_hits=partial,
        eagle_lookup_ceiling="hashed" if v >= (0, 32, 0) else "n_minus_1",
        # 0.33.0 keeps J - bs only when the Mamba manager itself is an EAGLE
        # group's; vLLM flags the draft layer's (attention) group, never Mamba.
        junction_back_off=False,
        tail_checkpoint="checkpoint" if v >= (0, 32, 0) else ("floor_drop" if v >= (0, 30, 0) else "floor"),
        has_replay_boundaries=v >= (0, 30, 0),
        fa_tail="cap_hashed" if v >= (0, 33, 0) else ("cap" if v >= (0, 32, 0) else "n"),
        prefill_checkpoint_grid=grid,
        shared_prefix_checkpoint=shared_ckpt,
    )
