"""Findings: a diverging case with everything needed to replay and read it.

A finding file is JSON: the case (schema 1, so ``kvspec run`` / ``replay``
take it directly) plus the oracle, the expected and observed hits, the
engine (version and the knobs it resolved), both sides' ``explain``, a
signature for deduplication and a one-line summary in #53504's terms::

    request 1 (resend) hit 0, spec says 9600; mask kept block 6, scheduler needed block 5

Finding schema 2 (``"kvspec_finding": 2``) also records everything involved:

* ``engine``: the engine under test: ``name`` (``vllm==X``), ``version``,
  ``vllm_files_sha256`` (the vLLM files under test, hashed by the engine:
  ``engine_adapter.vllm_engine.driver.vllm_files_sha256``), ``knobs``;
* ``other_engine``: for a ``versions`` finding the engine it was compared
  with (``name``, ``version``, ``vllm_files_sha256`` when its observation
  was at hand), else null;
* ``kvspec``: ``version`` (the package's) and ``commit`` (the git commit of
  the checkout, when there is one; ``dirty`` when it had local changes);
* ``harness``: ``mode`` (``inprocess`` / ``worker``) and ``platform``;
* the deployment and reachability fields: ``case_kind``, ``reachable``,
  ``reachability``, ``resolution``.

Schema 1 files still load (:func:`load_finding` upgrades them in memory:
the missing fields are null, a ``versions`` finding's other engine is read
from its detail ``expected = vllm==Y``).

Files are written atomically and named by signature, so a campaign killed at
any point leaves whole findings only, and a rediscovered bug overwrites its
own file instead of adding another.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
import subprocess
import time
from pathlib import Path

from engine_adapter.host.versions import engine_name
from fuzz.judge.oracles import KNOWN_ORACLES, SAME_HITS_ORACLES, Divergence, request_kinds
from fuzz.judge.verdict import other_engine_version
from fuzz.results.finding_text import deployment_text, engine_title, prompt_text
from fuzz.results.impact import cost_of
from ground.engines import FAMILIES
from ground.errors import InvalidArgument, invalid
from ground.files import load_json, write_json_atomic
from ground.home import REPO_ROOT
from ground.printable import printable
from reference.case import Case, case_to_dict, parse_case
from reference.reachability import reachability

FINDING_SCHEMA = 2
#: Finding schemas this kvspec reads.
READS_SCHEMAS = (1, 2)


def _mamba_blocks(explain: list, request: int) -> list[int] | None:
    """Mamba block indices an engine/model explain says were kept by requests
    before ``request`` (the union over Mamba groups)."""
    blocks: set[int] = set()
    found = False
    for step in explain[:request]:
        kept = step.get("retained_mamba_blocks") or step.get("mamba_blocks_cached") or {}
        values = kept.values() if isinstance(kept, dict) else [kept]
        for v in values:
            if isinstance(v, dict):  # per group id -> {block size: [...]}
                v = [x for vv in v.values() for x in (vv if isinstance(vv, list) else [])]
            found = True
            blocks.update(int(x) for x in v)
    return sorted(blocks) if found else None


def summary(case: Case, div: Divergence, engine_explain: list | None = None) -> str:
    """One line, first divergence first."""
    if div.oracle == "engine_error":
        first_line = " ".join(div.detail.split())[:300]
        return f"{engine_title(engine_name(str(div.version)))} raised at request {div.first}: {first_line}"
    if div.oracle in ("knobs", "resolution"):
        return div.detail
    i = div.first
    kinds = request_kinds(case)
    if div.oracle == "retention":  # the hits agree; the states the cache holds do not
        return f"request {i} ({kinds[i]}) holds Mamba states {div.context['observed_states'][i]}, expected {div.context['expected_states'][i]} ({div.detail})"
    if div.oracle in SAME_HITS_ORACLES or (
        div.oracle == "stale" and div.expected[i : i + 1] == div.observed[i : i + 1]
    ):
        return f"request {i} ({kinds[i]}): {div.detail}"  # the hits agree; the chunks, blocks, junction or held states do not
    text = f"request {i} ({kinds[i]}) hit {div.observed[i]}, {'spec says' if div.oracle in ('promise', 'reference') else 'expected'} {div.expected[i]}"
    model = div.context.get("model_explain")
    mamba = case.geometry.mamba_block_sizes if case.geometry is not None else None  # llama.cpp: no geometry
    if model and mamba and engine_explain:
        kept = _mamba_blocks(engine_explain, i)
        need = div.expected[i] // mamba[0] - 1
        if kept is not None and need >= 0:
            text += f"; mask kept block{'s' if len(kept) != 1 else ''} {','.join(map(str, kept)) or 'none'}, scheduler needed block {need}"
    if div.detail:
        text += f" ({div.detail})"
    return text


def signature(case: Case, div: Divergence, knobs: dict) -> str:
    """What makes two findings the same bug: oracle, version, the resolved
    speculative knobs, the geometry class (uniform / mixed / partial hash
    hits), retention mode, a hash unit finer than the block, the diverging
    request's kind, whether
    its prompt is block-aligned, whether a ``stale`` hit read a state in the
    step that computes it (a concurrent trace), and the direction of the error (for
    ``split``: a prefill chunk's end or a step after the prefill cut)."""
    parts = [
        div.oracle,
        div.version,
        case.kind,
        f"drop={knobs.get('eagle_drop')}",
        f"la={knobs.get('hash_lookahead_tokens')}",
    ]
    if div.oracle == "resolution":  # judged before the case is resolved: no geometry, no request
        return hashlib.sha256("|".join(map(str, parts + [div.context.get("rule")])).encode()).hexdigest()[:16]
    g = case.geometry
    if g is None:  # vLLM raised before it resolved the deployment (engine_error at setup)
        return hashlib.sha256(
            "|".join(map(str, parts + ["unresolved", div.detail.split(":")[0]])).encode()
        ).hexdigest()[:16]
    sizes = {x.block_size for x in g.groups}
    parts.append("uniform" if len(sizes) == 1 else ("partial" if knobs.get("partial_hash_hits") else "mixed"))
    parts.append({None: "dense", 0: "sparse"}.get(g.retention_interval, "periodic"))
    if g.hash_block_size is not None and g.hash_block_size < g.scheduler_block_size:
        parts.append("hash<block")  # a finer hash unit moves the boundaries (hash-unit tails): another class
    if div.first is not None and div.requests and div.oracle not in ("engine_error", "knobs"):
        i = div.first
        n = case.trace[i].num_prompt_tokens
        parts += [request_kinds(case)[i], "aligned" if n % g.scheduler_block_size == 0 else "unaligned"]
        if div.oracle == "stale" and div.context.get("same_step"):
            parts.append("same-step")  # it read a state in the step computing it: another class than the serial one
        if div.oracle == "hit_blocks":
            parts.append("extra" if div.context["extra_blocks"][i] > 0 else "missing")
        elif div.oracle == "block_table":
            parts.append("blocks")
        elif div.oracle == "shared_prefix":
            junction, hit, reach = div.context["bad_junctions"][i]
            parts.append("past" if junction > reach else "below")
        elif div.oracle in ("split", "checkpoint"):
            # split names a stray chunk end first, else a cut step after the prefill
            stray = (div.context.get("stray_ends") or [[]] * (i + 1))[i]
            parts.append("decode" if div.oracle == "split" and not stray else "chunk")
        elif div.oracle == "retention":
            held, want = set(div.context["observed_states"][i]), set(div.context["expected_states"][i])
            output = (div.context.get("output_states") or [[]] * (i + 1))[i]
            parts.append(
                ("extra" if held - want - set(output) else "")
                + ("output" if output else "")
                + ("missing" if want - held else "")
            )
        elif i < len(div.observed) and i < len(div.expected):
            parts.append("low" if div.observed[i] < div.expected[i] else "high")
    elif div.oracle == "engine_error":
        parts.append(div.detail.split(":")[0])
    else:
        parts.append(div.detail)
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16]


def _engine_record(version: str, observation: dict | None) -> dict:
    """An engine in a finding. A build (``X+LABEL.HASH``: a patched,
    local-tree or wheel engine) also records what it is made of: its
    release, sources (each patch's path and sha256) and replaced files."""
    observation = observation or {}
    record = {
        "name": engine_name(version),
        "version": version,
        "vllm_files_sha256": observation.get("vllm_files_sha256"),
    }
    if "+" in version:
        from engine_adapter.host.builds import describe

        record["build"] = describe(version)
    return record


@functools.lru_cache(maxsize=1)
def kvspec_version() -> dict:
    """This kvspec: the package version, and the git commit of the checkout
    when it is one (``dirty``: tracked files changed since). Once per process."""
    try:
        version = importlib.metadata.version("kvspec")
    except importlib.metadata.PackageNotFoundError:
        version = None
    commit = dirty = None
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0 and out.stdout.strip():
            commit = out.stdout.strip()
            st = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": version, "commit": commit, "dirty": dirty}


def make_finding(
    case: Case,
    div: Divergence,
    observation: dict,
    *,
    seed: int | None = None,
    reproduced: bool = True,
    platform: str = "cuda",
    other_observation: dict | None = None,
) -> dict:
    """The finding record (schema 2). ``case`` is the case as judged (a
    deployment case with the geometry its engine resolved). A deployment is
    reachable by construction; a hand geometry is labelled ``synthetic``
    with whether it breaks a rule every vLLM deployment obeys
    (``reference.reachability``). ``other_observation``: the other engine's
    run of a ``versions`` finding (for its files' digest)."""

    knobs = observation.get("knobs") or {}
    harness = observation.get("harness") if isinstance(observation.get("harness"), dict) else {}
    run_platform = harness.get("platform") or (case.deployment.platform if case.deployment else platform)
    reach = reachability(case, div.version, case.deployment.platform if case.deployment else platform)
    other_version = div.context.get("other_version") if div.oracle == "versions" else None
    finding = {
        "kvspec_finding": FINDING_SCHEMA,
        "summary": summary(case, div, observation.get("explain")),
        "oracle": div.oracle,
        "signature": signature(case, div, knobs),
        "engine": {**_engine_record(div.version, observation), "knobs": knobs},
        "other_engine": _engine_record(other_version, other_observation) if other_version else None,
        "kvspec": kvspec_version(),
        "harness": {
            "mode": harness.get("mode"),
            "platform": run_platform,
            # the run options it was observed with, which a replay passes again (llama.cpp's L1)
            **({"options": harness["options"]} if harness.get("options") else {}),
        },
        "first_divergence": div.first,
        "diverging_requests": div.requests,
        "expected": {
            "hits": div.expected,
            "detail": div.detail,
            **({"states": div.context["expected_states"]} if "expected_states" in div.context else {}),
        },
        "observed": {
            "hits": observation.get("hits", []),
            "queries": observation.get("queries", []),
            "error": observation.get("error"),
            **({"states": div.context["observed_states"]} if "observed_states" in div.context else {}),
        },
        "explain": {"model": div.context.get("model_explain", []), "engine": observation.get("explain", [])},
        "reproduced_twice": reproduced,
        "seed": seed,
        "found_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "case_kind": reach["kind"],
        "reachable": reach["reachable"],
        "reachability": reach["reason"],
        "resolution": observation.get("resolution"),
        "case": case_to_dict(case),
    }
    finding["cost"] = cost_of(finding)  # not part of the signature: what the finding costs, never which bug it is
    return finding


def write_finding(finding: dict, out_dir: str | Path) -> Path:
    path = Path(out_dir) / f"{finding['oracle']}-{finding['signature']}.json"
    write_json_atomic(path, finding)
    return path


def upgrade(finding: dict) -> dict:
    """A finding of any schema this kvspec reads, in schema 2's shape (in
    memory; the file is untouched): fields schema 1 lacks are null, and a
    ``versions`` finding's other engine is read from its detail. A schema
    this kvspec does not read is one line."""
    schema = finding.get("kvspec_finding", 1)
    if type(schema) is not int or schema not in READS_SCHEMAS:
        raise invalid(
            "kvspec_finding", schema, f"this kvspec reads finding schemas {', '.join(map(str, READS_SCHEMAS))}"
        )
    if schema == FINDING_SCHEMA:
        return finding

    out = dict(finding)
    engine = out.get("engine") if isinstance(out.get("engine"), dict) else {}
    version = engine.get("version")
    out["engine"] = {
        **({"name": engine_name(version), "version": version, "vllm_files_sha256": None} if version else {}),
        **engine,
    }
    other = other_engine_version(finding)
    out.setdefault(
        "other_engine", {"name": engine_name(other), "version": other, "vllm_files_sha256": None} if other else None
    )
    for key in ("kvspec", "harness", "case_kind", "reachable", "reachability", "resolution"):
        out.setdefault(key, None)
    return out


def is_finding(raw) -> bool:
    """The one rule for what a file holds: a finding is a JSON object with
    its ``case`` inside; anything else is read as a bare case."""
    return isinstance(raw, dict) and "case" in raw


def load_finding(path: str | Path) -> tuple[Case, dict]:
    """The one loader of finding files (``kvspec fuzz --case``, ``replay``,
    ``report``, ``matrix``, ``findings``, live replay): a finding file (or a
    bare case file) -> (case, finding fields, in schema 2's shape:
    :func:`upgrade`); ``{}`` for a bare case. Read within
    ``ground.files``' limits; every refusal is one line naming the field
    and what is allowed (:class:`ground.errors.InvalidArgument`)."""
    raw = load_json(path, "finding file")
    if not isinstance(raw, dict):
        raise invalid("finding file", str(path), "must hold a JSON object (a finding or a case)")
    if is_finding(raw):
        return parse_case(raw["case"]), upgrade(raw)
    return parse_case(raw), {}


#: A finding's signature: hex, as :func:`signature` writes it (16 digits).
SIGNATURE = re.compile(r"^[0-9a-f]{6,64}$")
#: An engine version a finding names: a release or a build (X+LABEL.HASH),
#: of vLLM (bare) or of a family that names itself (``sglang==X``).
ENGINE_VERSION = re.compile(
    rf"^(?:(?:{'|'.join(map(re.escape, FAMILIES))})==)?" + r"\d{1,4}\.\d{1,4}\.\d{1,6}(?:\+[a-z0-9][a-z0-9.-]{0,99})?$"
)


def _hits(finding: dict, side: str) -> None:
    if side not in finding:
        raise InvalidArgument(
            f"{side}: missing; required field (an object with the {side} hits per request, as kvspec writes a finding)"
        )
    record = finding[side]
    if not isinstance(record, dict):
        raise invalid(
            side, record, f"must be an object with 'hits' (the {side} hits per request), as kvspec writes a finding"
        )
    hits = record.get("hits")
    if not isinstance(hits, list) or not all(type(h) is int and h >= 0 for h in hits):
        raise invalid(f"{side}.hits", hits, "must be a list of hit counts (integers >= 0)")
    for key in ("states",):
        if record.get(key) is not None and not isinstance(record[key], list):
            raise invalid(f"{side}.{key}", record[key], "must be a list (per request) or absent")
    if side == "expected" and not isinstance(record.get("detail"), (str, type(None))):
        raise invalid("expected.detail", record["detail"], "must be a string or absent")
    error = record.get("error") if side == "observed" else None
    if error is not None and not (isinstance(error, dict) and isinstance(error.get("message", ""), str)):
        raise invalid("observed.error", error, "must be null or an object whose message is a string")


def check_fields(finding: dict) -> dict:
    """The fields a finding's readers (``kvspec report``, :func:`render`)
    use, checked before any of them is used: the signature is hex, the
    oracle one kvspec has, the engine names a version, ``expected`` and
    ``observed`` are objects with hit lists, the request indices are
    integers, the texts are strings. The first malformed field is one line
    naming it (``field=value: allowed``); the finding is returned as is."""

    sig = finding.get("signature")
    if not isinstance(sig, str) or not SIGNATURE.match(sig):
        raise invalid("signature", sig, "must be 6 to 64 lowercase hex digits, as kvspec writes a finding's signature")
    oracle = finding.get("oracle")
    if not isinstance(oracle, str) or oracle not in KNOWN_ORACLES:
        raise invalid("oracle", oracle, f"allowed: {', '.join(KNOWN_ORACLES)}")
    engine = finding.get("engine")
    version = engine.get("version") if isinstance(engine, dict) else None
    if not isinstance(version, str) or not ENGINE_VERSION.match(version):
        raise invalid(
            "engine",
            engine,
            "must be an object whose version is an engine version (vLLM's X.Y.Z or FAMILY==X.Y.Z, or a build of one: +LABEL.HASH)",
        )
    if not isinstance(engine.get("knobs", {}), dict):
        raise invalid("engine.knobs", engine["knobs"], "must be an object")
    for side in ("expected", "observed"):
        _hits(finding, side)
    case = finding.get("case")
    trace = case.get("trace") if isinstance(case, dict) else None
    n = len(trace) if isinstance(trace, list) else None
    for side in ("expected", "observed"):
        hits = finding[side]["hits"]
        if n is not None and len(hits) > n:
            raise invalid(f"{side}.hits", hits, f"at most one hit count per request of case.trace ({n})")
    first = finding.get("first_divergence")
    if first is not None and (type(first) is not int or first < 0 or (n is not None and first >= n)):
        raise invalid(
            "first_divergence",
            first,
            f"must be a request index (an integer in [0, {n})) or null"
            if n is not None
            else "must be a request index (an integer >= 0) or null",
        )
    requests = finding.get("diverging_requests", [])
    if not isinstance(requests, list) or not all(type(i) is int and i >= 0 and (n is None or i < n) for i in requests):
        raise invalid(
            "diverging_requests", requests, "must be a list of request indices (integers in [0, len(case.trace)))"
        )
    for key in ("summary", "case_kind", "reachability"):
        if not isinstance(finding.get(key), (str, type(None))):
            raise invalid(key, finding[key], "must be a string or absent")
    for key in ("other_engine", "kvspec", "harness", "resolution", "cost"):
        if not isinstance(finding.get(key), (dict, type(None))):
            raise invalid(key, finding[key], "must be an object or null")
    assumptions = (finding.get("resolution") or {}).get("assumptions")
    if assumptions is not None and not (isinstance(assumptions, list) and all(isinstance(a, str) for a in assumptions)):
        raise invalid("resolution.assumptions", assumptions, "must be a list of strings")
    return finding


def render(finding: dict) -> str:
    """The finding as text, like an Alive2 counterexample: the inputs first,
    then model vs engine per request, the first divergence marked. Each line
    is :func:`~ground.printable.printable`: a finding's fields are a
    stranger's text, and reach a terminal only without control characters
    (a field's line break is a space, never a line of its own)."""
    case = finding["case"]
    engine = finding["engine"]
    lines = [
        f"finding {finding['signature']} [{finding['oracle']}] on {engine.get('name') or engine_name(str(engine['version']))}",
        f"  {finding['summary']}",
        "",
        "inputs:",
    ]
    if case.get("deployment"):
        lines.append(f"  deployment: {deployment_text(case['deployment'])}")
    elif finding.get("case_kind") == "synthetic":
        lines.append(
            f"  SYNTHETIC geometry (written by hand; reachable={finding.get('reachable')}: {finding.get('reachability')})"
        )
    g = case.get("geometry")
    title = engine_title(engine.get("name") or engine_name(str(engine["version"])))
    if g is None and finding.get("oracle") == "resolution":
        lines.append(f"  geometry: not judged further ({title}'s resolution breaks a rule {title} documents; above)")
    elif g is None:
        lines.append(f"  geometry: not resolved ({title} raised before it built one)")
    else:
        groups = ", ".join(f"{x['count']}x {x['kind']} block {x['block_size']}" for x in g["groups"])
        extra = (
            f", prefill checkpoint grid {g['prefill_checkpoint_grid']}" if g.get("prefill_checkpoint_grid") else ""
        ) + (", shared-prefix checkpoint" if g.get("shared_prefix_checkpoint") else "")
        lines.append(
            f"  geometry: {groups}; scheduler block {g['scheduler_block_size']}, hash block {g['hash_block_size']}, retention {g['retention_interval']}, chunk budget {g['max_num_batched_tokens']}{extra}"
        )
    lines.append(f"  speculative: {json.dumps(case.get('speculative'))}")
    lines.append(f"  engine knobs: {json.dumps(finding['engine']['knobs'], sort_keys=True)}")
    for role, e in (("engine", finding.get("engine")), ("other engine", finding.get("other_engine"))):
        if isinstance(e, dict) and e.get("vllm_files_sha256"):
            lines.append(
                f"  {role}: {e.get('name')} ({engine_title(e.get('name'))} files under test sha256 {e['vllm_files_sha256'][:16]})"
            )
        elif isinstance(e, dict) and role == "other engine":
            lines.append(f"  {role}: {e.get('name')}")
    h, k = finding.get("harness") or {}, finding.get("kvspec") or {}
    if h or k:
        lines.append(
            f"  harness: {h.get('mode') or '?'} on {h.get('platform') or '?'}; kvspec {k.get('version') or '?'}"
            + (f" at {k['commit'][:12]}" + ("+dirty" if k.get("dirty") else "") if k.get("commit") else "")
        )
    for i, r in enumerate(case["trace"]):
        sent = (
            ""
            if r.get("arrival") is None
            else f"  (sent {r['arrival']} scheduler step(s) after request {i - 1}, sharing steps)"
        )
        lines.append(f"  request {i}: " + prompt_text(r["prompt"]) + sent)
    states = finding["expected"].get("states") is not None and finding["observed"].get("states") is not None
    lines += [
        "",
        "request  expected  observed" + ("  (Mamba states the cache holds; the hits agree)" if states else ""),
    ]
    exp, obs = (
        (finding["expected"]["states"], finding["observed"]["states"])
        if states
        else (finding["expected"]["hits"], finding["observed"]["hits"])
    )
    for i in range(max(len(exp), len(obs))):
        e = exp[i] if i < len(exp) else "-"
        o = obs[i] if i < len(obs) else "-"
        mark = (
            "  <- first divergence"
            if i == finding.get("first_divergence")
            else ("  <- differs" if i in finding.get("diverging_requests", []) else "")
        )
        lines.append(f"{i:7d}  {e!s:>8}  {o!s:>8}{mark}")
    if finding["observed"].get("error"):
        lines += ["", "engine error:", "  " + str(finding["observed"]["error"].get("message", ""))]
    return "\n".join(printable(line) for line in lines)


def write_harness_error(case: Case | None, trace: str, out_dir: str | Path) -> Path:
    """A bug in kvspec itself, recorded (atomically) instead of crashing a
    campaign; ``kvspec fuzz`` lists these apart from findings. ``case`` is
    None when the failure came before any case existed."""
    digest = hashlib.sha256(trace.encode()).hexdigest()[:16]
    path = Path(out_dir) / "harness-errors" / f"{digest}.json"
    write_json_atomic(path, {"traceback": trace, "case": None if case is None else case_to_dict(case)})
    return path
