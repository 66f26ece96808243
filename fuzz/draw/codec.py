"""Fuzzer bytes <-> cases. Every byte string decodes to a valid case.

Three layouts, chosen by the first byte's low two bits:

* ``x0``: *generated*: the rest feeds ``fuzz.draw.generate.build_case`` as a
  stream of choices (structure-aware: resends, siblings, aligned lengths);
  over deployments its first choice is the deployment class
  (``fuzz.draw.generate.deployment_classes``), so each class is as likely as any
  other, as the random driver's schedule walks them.
* ``01``: *literal*: the bytes spell a hand-geometry case field by field, so
  any case in the literal domain (uniform or mixed 16-multiple blocks, up to
  8 requests of up to 4 segments) can be written as a corpus entry: this is
  how the z3 boundary cases from ``spec/`` seed a synthetic campaign.
* ``11``: *deployment literal*: the rest is a deployment case as compact
  JSON (the z3 boundary cases mapped onto real deployments,
  ``fuzz.draw.seeds.on_deployment``); a mutation that breaks it decodes as a
  generated input.

Saved findings are cases (JSON), never these bytes; the bytes only live in
the fuzzer's corpus.
"""

from __future__ import annotations

import json
import struct

from fuzz.draw.choosers import BytesChooser
from fuzz.draw.generate import DEPLOYMENT_MODELS, SPECULATIVE, build_case, deployment_classes
from ground.errors import KvspecError
from reference.case import Case, case_to_dict, parse_case

_NAMES = "ABCDEFGHIJKLMNOP"
_RETENTION = ("sparse", "dense", "periodic")
MAX_LITERAL_TOKENS = 1 << 16
MAX_DEPLOYMENT_LITERAL = 1 << 16


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def u(self, n: int) -> int:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return int.from_bytes(chunk.ljust(n, b"\0"), "little")


def _decode_literal(r: _Reader) -> Case:
    attention = 16 * (1 + r.u(1) % 128)
    mamba = 16 * (1 + r.u(1) % 128)
    if max(attention, mamba) % min(attention, mamba):
        mamba = attention
    count = 1 + r.u(1) % 3
    scheduler = max(attention, mamba)
    retention = _RETENTION[r.u(1) % 3]
    interval = {"sparse": 0, "dense": None, "periodic": scheduler * (1 + r.u(1) % 4)}[retention]
    budget = max(r.u(2) or 8192, scheduler)  # a chunk at least one block
    speculative = SPECULATIVE[r.u(1) % len(SPECULATIVE)]
    trace = []
    for _ in range(1 + r.u(1) % 8):
        prompt = []
        for _ in range(1 + r.u(1) % 4):
            prompt.append({"segment": _NAMES[r.u(1) % len(_NAMES)], "length": 1 + r.u(2) % MAX_LITERAL_TOKENS})
        trace.append({"prompt": prompt})
    return parse_case(
        {
            "schema": 1,
            "geometry": {
                "groups": [
                    {"kind": "full_attention", "block_size": attention},
                    {"kind": "mamba", "block_size": mamba, "count": count},
                ],
                "retention_interval": interval,
                "max_num_batched_tokens": budget,
            },
            "speculative": speculative,
            "trace": trace,
        }
    )


def decode(data: bytes, resolver=None) -> Case:
    """Bytes -> a valid case (never raises on any input). Generated inputs
    are deployments when a ``resolver`` is given (``fuzz.draw.generate``);
    literal inputs are hand geometries (the z3 seeds). With a ``resolver``
    (a campaign over deployments) every case is a deployment: a hand
    literal (a mutation of a deployment input can turn into one) is read as
    a generated input instead, so no hand geometry reaches the engine."""
    if data[:1] and data[0] & 3 == 3:
        try:
            raw = json.loads(data[1 : 1 + MAX_DEPLOYMENT_LITERAL].decode("utf-8"))
            case = parse_case(raw)
            if case.deployment is not None and case.geometry is None and case.deployment.model in DEPLOYMENT_MODELS:
                return case
        except (ValueError, UnicodeDecodeError, RecursionError, KvspecError):
            pass
    elif data[:1] and data[0] & 1 and resolver is None:
        try:
            return _decode_literal(_Reader(data[1:]))
        except KvspecError:
            pass  # e.g. a budget the validator refuses: fall back to generated
    chooser = BytesChooser(data[1:])
    if resolver is not None:  # the deployment class first, as the random driver's schedule walks them
        return build_case(chooser, resolver=resolver, cls=chooser.choice(deployment_classes()))
    return build_case(chooser)


def encode_deployment(case: Case) -> bytes:
    """A deployment case -> bytes ``decode`` maps back to it."""
    if case.deployment is None or case.geometry is not None:
        raise ValueError("a deployment literal holds an unresolved deployment case")
    text = json.dumps(case_to_dict(case), separators=(",", ":"), sort_keys=True).encode()
    if len(text) > MAX_DEPLOYMENT_LITERAL:
        raise ValueError(f"deployment literals hold at most {MAX_DEPLOYMENT_LITERAL} bytes of JSON")
    return b"\x03" + text


def encode(case: Case) -> bytes:
    """A case in the literal domain -> bytes that ``decode`` maps back to it
    (a deployment case: a deployment literal).

    Raises ``ValueError`` for a case outside the literal domain."""
    if case.deployment is not None:
        return encode_deployment(case)
    if any(r.arrival is not None for r in case.trace):
        raise ValueError("literal cases are serial (a concurrent case is drawn by the generated layout)")
    raw = case_to_dict(case)
    g = raw["geometry"]
    groups = g["groups"]
    if len(groups) != 2 or groups[0]["kind"] != "full_attention" or groups[1]["kind"] != "mamba":
        raise ValueError("literal cases have one attention group and one Mamba group kind")
    attention, mamba = groups[0]["block_size"], groups[1]["block_size"]
    if (
        attention % 16
        or mamba % 16
        or attention > 2048
        or mamba > 2048
        or max(attention, mamba) % min(attention, mamba)
    ):
        raise ValueError("literal blocks are multiples of 16 up to 2048, one dividing the other")
    if g["prefix_match_unit"] is not None or g["hash_block_size"] != min(attention, mamba) or groups[1]["count"] > 3:
        raise ValueError("literal geometry has no prefix_match_unit and at most 3 Mamba groups")
    interval = g["retention_interval"]
    scheduler = g["scheduler_block_size"]
    out = bytearray([1, attention // 16 - 1, mamba // 16 - 1, groups[1]["count"] - 1])
    if interval == 0:
        out += bytes([0, 0])
    elif interval is None:
        out += bytes([1, 0])
    elif interval % scheduler == 0 and 1 <= interval // scheduler <= 4:
        out += bytes([2, interval // scheduler - 1])
    else:
        raise ValueError("literal periodic intervals are 1-4 scheduler blocks")
    budget = g["max_num_batched_tokens"]
    if not scheduler <= budget < 1 << 16:
        raise ValueError("literal budgets are one scheduler block to 65535 tokens")
    out += struct.pack("<H", budget)
    try:
        out.append(SPECULATIVE.index(raw["speculative"]))
    except ValueError:
        raise ValueError("literal speculative settings are those of fuzz.draw.generate.SPECULATIVE") from None
    trace = raw["trace"]
    if not 1 <= len(trace) <= 8 or any(r["max_tokens"] != 1 for r in trace):
        raise ValueError("literal traces have 1-8 requests with max_tokens 1")
    out.append(len(trace) - 1)
    for r in trace:
        if not 1 <= len(r["prompt"]) <= 4:
            raise ValueError("literal prompts have 1-4 segments")
        out.append(len(r["prompt"]) - 1)
        for s in r["prompt"]:
            if s["segment"] not in _NAMES or not 1 <= s["length"] <= MAX_LITERAL_TOKENS:
                raise ValueError(
                    f"literal segments are named {_NAMES[0]}-{_NAMES[-1]} with 1-{MAX_LITERAL_TOKENS} tokens"
                )
            out.append(_NAMES.index(s["segment"]))
            out += struct.pack("<H", (s["length"] - 1) % MAX_LITERAL_TOKENS)
    return bytes(out)
