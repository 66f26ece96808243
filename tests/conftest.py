"""Shared test helpers: building cases without JSON files."""

from __future__ import annotations

import pytest

from reference.case import parse_case

MTP_DROP = {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True}
MTP = {"method": "mtp", "num_speculative_tokens": 2}


def hybrid(attention: int, mamba: int, mamba_count: int = 3, **geometry) -> dict:
    return {"groups": [{"kind": "full_attention", "block_size": attention}, {"kind": "mamba", "block_size": mamba, "count": mamba_count}], **geometry}


def make_case(geometry: dict, prompts, speculative=None, name=None):
    """prompts: a list of prompts, each a list of (segment, length)."""
    return parse_case({
        "schema": 1,
        "name": name,
        "geometry": geometry,
        "speculative": speculative,
        "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
    })


@pytest.fixture
def seed_case():
    return make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP, name="seed-53504")
