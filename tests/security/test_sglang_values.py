"""SGLang values the driver cannot run are refused at the allow-list
(issue 40 item 6): ``--page-size``, ``--chunked-prefill-size`` and the
pinned pools (``--max-total-tokens``, ``--max-mamba-cache-size``) outside
1..2^20 (a negative page, SGLang's ``-1`` "no chunked prefill", zero, a
size above the case limits) are one line naming the index, the flag and
the allowed range, exit 2, before any engine is opened (a test double for
``open_engine`` fails the test if it is called). The ranges' sources
(SGLang 0.5.23 file:line) are in ``reference/sglang_flags.py``.
"""

from __future__ import annotations

import json

import pytest

from ground.errors import InvalidArgument
from kvspec.cli import main as kvspec
from reference.case import parse_case

#: (sglang_args, flag named in the refusal)
REFUSED = [
    (["--page-size", "-64"], "--page-size=-64"),
    (["--page-size=0"], "--page-size=0"),
    (["--page_size", "2097152"], "--page-size=2097152"),
    (["--chunked-prefill-size", "-1"], "--chunked-prefill-size=-1"),
    (["--chunked-prefill-size=0"], "--chunked-prefill-size=0"),
    (["--page-size", "1", "--chunked_prefill_size=-000000001"], "--chunked-prefill-size=-000000001"),
    (["--max-total-tokens", "0"], "--max-total-tokens=0"),
    (["--max_mamba_cache_size=-1"], "--max-mamba-cache-size=-1"),
]


def _case(args: list[str]) -> dict:
    return {
        "schema": 1,
        "name": "sg",
        "deployment": {"model": "qwen3_next", "engine": "sglang", "sglang_args": args},
        "trace": [{"prompt": [{"segment": "A", "length": 3}]}, {"prompt": [{"segment": "A", "length": 3}]}],
    }


@pytest.mark.parametrize("args,named", REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_a_value_the_driver_cannot_run_is_refused_in_one_line(args, named):
    with pytest.raises(InvalidArgument) as e:
        parse_case(_case(args))
    text = str(e.value)
    assert named in text and "allowed: 1 to 1,048,576" in text and "\n" not in text


@pytest.mark.parametrize("args,named", REFUSED[:4], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_run_refuses_it_before_any_engine(tmp_path, capsys, monkeypatch, args, named):
    import engine_adapter
    import engine_adapter.host.engine

    def no_engine(*a, **k):
        raise AssertionError("an engine was opened")

    monkeypatch.setattr(engine_adapter, "open_engine", no_engine)
    monkeypatch.setattr(engine_adapter.host.engine, "open_engine", no_engine)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(_case(args)))
    rc = kvspec(["run", str(path), "--engine", "sglang==0.5.23"])
    err = capsys.readouterr().err
    assert rc == 2 and named in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["--page-size", "1"],
        ["--page-size", "64", "--chunked-prefill-size", "4096"],
        ["--chunked-prefill-size=1048576"],
        ["--max-total-tokens", "4096", "--max-mamba-cache-size", "8"],
    ],
)
def test_values_in_range_still_pass(args):
    assert parse_case(_case(args)).deployment.sglang_args == tuple(args)
