"""An upstream-ready report for an SGLang finding (``kvspec report`` on a
finding whose engine is ``sglang==X``): ``ISSUE.md`` in SGLang's bug-report
template (Checklist, Describe the bug, Reproduction, Environment), a
regression test in the style of SGLang's ``test/registered/unit/mem_cache/``
CPU tests (``unittest``, ``register_cpu_ci``; it drives SGLang's own
``UnifiedRadixCache`` and the scheduler's prefill steps and imports nothing
of kvspec), the fix (``fixes/sglang-0.5.23-*.diff`` the finding's class
names) and the finding.

The test fails on the release and passes on the fixed build: a lost-reuse
finding asserts the promise's hits; a ``resumed_state`` finding asserts
every resumed Mamba state was computed over exactly the tokens it is keyed
by (the state the kernel copies is stood in by a fingerprint of the tokens
it covers, placed where SGLang's own track plan says:
``layers/attention/mamba/prefill_track_metadata.py``).

A finding is a stranger's file: every value the test holds is a Python
literal (:func:`fuzz.report._literal`: ``repr``, read back equal); ISSUE.md
shows its text escaped as :mod:`fuzz.report` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template

from fuzz.findings import check_fields
from fuzz.known_classes import classify as known_class
from fuzz.report import _case_of, _cell, _code, _fence, _literal, _text
from ground.engines import family_of
from ground.printable import printable

ROOT = Path(__file__).resolve().parent.parent

#: Per known SGLang class: what goes wrong, where (0.5.23 wheel), the fix, prior art.
SGLANG_CLASSES = {
    "sglang-grid-resend": {
        "title": "an identical resend of a prompt of k x grid tokens misses the state its prefill tracked",
        "why": "the prefill tracks its state at N (`schedule_batch.py:3137 _mamba_radix_cache_v2_req_prepare_for_extend`: "
        "`prefix_len + (extend_len // grid) * grid`); the resend is capped at N-1 (`schedule_batch.py:1766 _compute_max_prefix_len`), "
        "so the walk stops one token inside that node and resumes at the previous chunk end",
        "fix": ["fixes/sglang-0.5.23-keep-cut.diff"],
        "prior": 'Reported upstream before as sgl-project/sglang#30882 and #21350 ("Improve reusable Mamba prefix tracking for aligned prefills"), '
        "both closed unmerged. What this report adds: a fix validated by a campaign on the patched build, a regression test, and the second "
        "class (a sibling keeps only its branching point).",
    },
    "sglang-sibling-branch": {
        "title": "a resend or extension of a sibling resumes at the branching point only",
        "why": "a request whose match names a branching point tracks it instead of its own last grid point "
        "(`schedule_batch.py:3214-3231`): one state per extend, so the sibling keeps nothing past the branch",
        "fix": ["fixes/sglang-0.5.23-keep-cut.diff"],
        "prior": "The grid-resend class of the same mechanism was reported upstream as sgl-project/sglang#30882 and #21350 (closed unmerged); "
        "this sibling class is not in either.",
    },
    "sglang-off-page-key": {
        "title": "a Mamba state is keyed below the tokens it was computed over (a chunk started off the page)",
        "why": "a continuing chunk takes min(remaining, budget) tokens unrounded without DCP (`schedule_policy.py:1140 add_chunked_req`, "
        "`:586 mamba_prefill_chunk_grid` returns 1), so the next extend starts off the page; its prefix-relative tracked point "
        "(`schedule_batch.py:3175-3180`) is off the page too, and `checkpoint_into_tree` keys it at the page floor "
        "(`unified_radix_cache.py:1232 page_aligned`): a later match resumes a state that has seen tokens past its key",
        "fix": ["fixes/sglang-0.5.23-chunk-on-grid.diff"],
        "prior": "Not found among upstream issues; `mamba_prefill_chunk_grid`'s docstring (0.5.23) says rounding the cut without DCP would "
        "only drop budget, which holds for the donation count but not for the key.",
    },
}


def regression_test_name(finding: dict) -> str:
    """The regression test's name: the known class's id (kvspec's own
    text), else ``finding_`` and the checked hex signature."""
    cls = known_class(finding)
    return (cls if cls in SGLANG_CLASSES else f"finding_{finding['signature']}").replace("-", "_")


#: The family this module reports for (``ground.engines.FAMILIES``' ``reporter``).
FAMILY = "sglang"


def is_sglang(finding: dict) -> bool:
    return family_of(str((finding.get("engine") or {}).get("version") or "")) == FAMILY


def issue_markdown(finding: dict, *, matrix: list[dict] | None = None, finding_path: str = "FINDING.json") -> str:
    case = _case_of(finding)
    cls_id = known_class(finding)
    cls = SGLANG_CLASSES.get(cls_id or "")
    version = printable(str(finding["engine"]["version"]))
    exp, obs = (finding.get("expected") or {}).get("hits") or [], (finding.get("observed") or {}).get("hits") or []
    title = cls["title"] if cls else printable(finding.get("summary") or "a kvspec finding")
    flags = " ".join(case.deployment.sglang_args) if case.deployment else ""
    lines = [
        f"# [Bug] Mamba radix cache: {_text(title)} ({_text(version)})",
        "",
        "### Checklist",
        "",
        "- [x] I searched related issues (prior art below) and found no fix for this in the release.",
        "- [x] The bug persists on the release named here (kvspec drives its own scheduler and cache on CPU; no GPU server was run).",
        "- [x] A minimal reproduction and a regression test are included.",
        "",
        "### Describe the bug",
        "",
        _text(
            f"With {flags or 'the default flags'} on {case.deployment.model if case.deployment else '?'}, request "
            f"{finding.get('first_divergence')} of the trace below does not keep kvspec's promise ({finding.get('oracle')} oracle)."
        ),
        "",
    ]
    if cls:
        lines += [_text("Where: ") + cls["why"] + ".", "", _text(cls["prior"]), ""]
    lines += ["| request | prompt (segments) | expected | observed |", "|---|---|---|---|"]
    for i, r in enumerate(case.trace):
        segs = " + ".join(f"{s.segment}:{s.length}" for s in r.prompt)
        lines.append(
            f"| {i} | {_cell(segs)} | {_cell(exp[i] if i < len(exp) else '-')} | {_cell(obs[i] if i < len(obs) else '-')} |"
        )
    detail = (finding.get("expected") or {}).get("detail")
    if detail:
        lines += ["", _text(f"The oracle: {detail}")]
    if matrix:
        lines += ["", "Per engine:", "", "| engine | hits | error |", "|---|---|---|"]
        lines += [f"| {_cell(m['engine'])} | {_cell(m.get('hits'))} | {_cell(m.get('error') or '')} |" for m in matrix]
    lines += [
        "",
        "### Reproduction",
        "",
        "Serve the model with these flags and send the requests one after another, one output token each:",
        "",
    ]
    lines += _fence(
        "",
        [
            f"python -m sglang.launch_server --model-path <{case.deployment.model if case.deployment else 'model'}> {flags}"
        ],
    )
    lines += [
        "",
        f"Or with kvspec (SGLang's own scheduler and cache, in-process): {_code('kvspec replay ' + finding_path + ' --engine ' + version)}.",
        f"The regression test beside this file ({_code('test_' + regression_test_name(finding) + '.py')}) is a CPU unit test in the style of "
        f"{_code('test/registered/unit/mem_cache/')}: it fails on {_text(version)} and passes with the fix applied.",
        "",
    ]
    if cls:
        lines += ["The fix: " + ", ".join(_code(f) for f in cls["fix"]) + " (in `fix.diff`).", ""]
    lines += [
        "### Environment",
        "",
        f"- SGLang {_text(version)} (the PyPI wheel), torch CPU; the scheduler's prefill path and `UnifiedRadixCache` (Python and Rust tree cores).",
        "- Found by kvspec's SGLang campaign (`kvspec fuzz --engine sglang==X`).",
    ]
    return "\n".join(lines) + "\n"


_TEST_TEMPLATE = Template('''"""CPU regression test: $doc_title.

Drives SGLang's UnifiedRadixCache (FULL + MAMBA) and the scheduler's prefill
steps (Req.init_next_round_input, PrefillAdder, ScheduleBatch.prepare_for_extend,
checkpoint_kv_cache between chunks, release_kv_cache at the end) for a serial
trace, one output token per request. The model forward is stood in: the
state the kernel would copy into a tracked slot is a fingerprint of the
tokens it covers, placed where SGLang's own track plan says
(layers/attention/mamba/prefill_track_metadata.py).
"""

import json
import os
import tempfile
import unittest
import zlib
from array import array

import torch

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.environ import envs
from sglang.srt.layers.attention.mamba.prefill_track_metadata import build_prefill_track_plan
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_exec, override_platform
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

try:
    from sglang.test.ci.ci_register import register_cpu_ci

    register_cpu_ci(est_time=20, suite="base-a-test-cpu")
except ImportError:
    pass

MODEL_CONFIG = $config
FLAGS = $flags
PROMPTS = $prompts
EXPECTED_HITS = $expected
CHECK = $check
LAYERS, FULL = 4, (3,)


def stream(name, n, names={}):
    base = 1000 + 100000 * names.setdefault(name, len(names))
    return list(range(base, base + n))


def fingerprint(tokens):
    return float(len(tokens) % (1 << 24)), float(zlib.crc32(array("q", tokens).tobytes()) % (1 << 24))


class TestMambaPrefixCacheRegression(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        with open(os.path.join(self.tmp.name, "config.json"), "w") as f:
            json.dump(MODEL_CONFIG, f)
        with override_platform(is_cuda=True):
            self.sa = prepare_server_args(["--model-path", self.tmp.name, "--device", "cuda", *FLAGS])
            self.sa.resolve_once()
            set_global_server_args_for_scheduler(self.sa)
            self.model_config = ModelConfig.from_server_args(self.sa)
            resolved = self.sa.resolved_dict()
        self.page = resolved["page_size"]
        self.chunk = resolved["chunked_prefill_size"]
        self.max_prefill = resolved["max_prefill_tokens"]
        self.extra = bool(get_exec().mamba.enable_mamba_extra_buffer)
        self.state_chunk = int(getattr(self.model_config.hf_text_config, "mamba_chunk_size", None) or 64)

    def tearDown(self):
        self.tmp.cleanup()

    def build(self, lengths):
        mamba_ids = [i for i in range(LAYERS) if i not in FULL]
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("float32"):
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1, num_heads=2, head_dim=16, state_size=16, conv_kernel=4)
            params = Mamba2CacheParams(shape=shape, layers=mamba_ids)
        page, n = self.page, len(lengths)
        size = (sum(lengths) + n + 4 * page + 1024) // page * page + page
        states = sum(x // max(1, self.chunk or x) + 6 for x in lengths) + 16
        self.req_pool = HybridReqToTokenPool(size=n + 4, mamba_size=states, mamba_spec_state_size=n + 4, max_context_len=max(lengths) + 16,
                                             device="cpu", enable_memory_saver=False, cache_params=params, mamba_layer_ids=mamba_ids,
                                             enable_mamba_extra_buffer=self.extra, speculative_num_draft_tokens=3)
        kv = HybridLinearKVPool(size=size, dtype=torch.bfloat16, page_size=page, head_num=1, head_dim=8, full_attention_layer_ids=list(FULL),
                                device="cpu", enable_memory_saver=False, mamba_pool=self.req_pool.mamba_pool)
        alloc = TokenToKVPoolAllocator if page == 1 else PagedTokenToKVPoolAllocator
        kwargs = {} if page == 1 else {"page_size": page}
        self.allocator = alloc(size=size, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False, **kwargs)
        self.tree = UnifiedRadixCache(params=CacheInitParams(
            req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.allocator, page_size=page, disable=False,
            tree_components=(ComponentType.FULL, ComponentType.MAMBA), enable_mamba_extra_buffer=self.extra,
            eviction_policy="lru", is_eagle=False, tree_core_backend="python"))

    def slot(self, idx):
        return int(self.req_pool.translate_mamba_indices(idx.reshape(1))[0])

    def write(self, idx, tokens):
        t = self.req_pool.mamba_pool.mamba_cache.temporal
        t[:, self.slot(idx)].zero_()
        flat = t[0, self.slot(idx)].view(-1)
        flat[0], flat[1] = fingerprint(tokens)

    def read(self, idx):
        flat = self.req_pool.mamba_pool.mamba_cache.temporal[0, self.slot(idx)].view(-1)
        return float(flat[0]), float(flat[1])

    def serve(self, i, tokens):
        params = SamplingParams(temperature=0, max_new_tokens=1)
        params.normalize(None)
        req = Req(rid=f"r{i}", origin_input_text="", origin_input_ids=array("q", tokens), sampling_params=params)
        running = ScheduleBatch.init_new([], self.req_pool, self.allocator, self.tree, self.model_config, False, SpeculativeAlgorithm.NONE)
        chunked, hit, resumed = None, None, None
        for _ in range(len(tokens) + 2):
            if chunked is not None:
                checkpoint_kv_cache(chunked, self.tree)
            adder = PrefillAdder(self.page, self.tree, self.allocator, running, 1.0, self.max_prefill, self.chunk)
            if chunked is not None:
                chunked.init_next_round_input()
                chunked = adder.add_chunked_req(chunked)
            else:
                req.init_next_round_input(self.tree)
                hit = req.prefix_len
                adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            if adder.new_chunked_req is not None:
                chunked = adder.new_chunked_req
            if chunked is not None:
                chunked.inflight_middle_chunks += 1
            batch = ScheduleBatch.init_new(adder.can_run_list, self.req_pool, self.allocator, self.tree, self.model_config, False,
                                           SpeculativeAlgorithm.NONE, chunked_req=chunked)
            batch.prepare_for_extend()
            # the model runner's deferred Mamba clear and copy-on-write
            if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices):
                self.req_pool.mamba_pool.clear_slots(self.req_pool.translate_mamba_indices(batch.mamba_clear_indices))
            if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices):
                self.req_pool.copy_mamba_state(self.req_pool.translate_mamba_indices(batch.mamba_cow_src_indices),
                                               self.req_pool.translate_mamba_indices(batch.mamba_cow_dst_indices))
            if resumed is None:
                resumed = self.read(req.kv.mamba_pool_idx) if hit else None
            self.write(req.kv.mamba_pool_idx, tokens[:req.extend_end])
            if self.extra and batch.mamba_prefill_track_mask_cpu is not None and batch.mamba_prefill_track_mask_cpu[0]:
                prefix, end = req.prefix_len, req.extend_end
                plan = build_prefill_track_plan([True], [int(batch.mamba_track_seqlens_cpu[0])], [end - prefix], [prefix], self.state_chunk, mamba2=False)
                covered = end if plan.final_rows else prefix + plan.chunk_indices[0] * self.state_chunk
                self.write(batch.mamba_track_indices[0], tokens[:covered])
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1
                continue
            req.output_ids.append(0)
            req.update_finish_state()
            release_kv_cache(req, self.tree, checkpoint=True)
            break
        return hit, resumed

    def test_regression(self):
        prompts = [[t for name, n in p for t in stream(name, n)] for p in PROMPTS]
        self.build([len(p) for p in prompts])
        hits = []
        for i, tokens in enumerate(prompts):
            hit, resumed = self.serve(i, tokens)
            hits.append(hit)
            if CHECK == "resumed" and hit:
                self.assertEqual(resumed, fingerprint(tokens[:hit]), f"request {i} resumed at {hit} from a state over other tokens")
        if CHECK == "hits":
            self.assertEqual(hits, EXPECTED_HITS)


if __name__ == "__main__":
    unittest.main()
''')


def regression_test(finding: dict) -> str:
    """The SGLang-style regression test's source (every finding value a literal)."""
    from engine_adapter.models.served import model_config_dict

    check_fields(finding)
    case = _case_of(finding)
    if case.deployment is None or case.deployment.engine != FAMILY:
        raise ValueError("an SGLang regression test needs an SGLang deployment")
    if any(s.output is not None for r in case.trace for s in r.prompt) or any(r.max_tokens != 1 for r in case.trace):
        raise ValueError("an SGLang regression test serves one-token outputs and prompts of segments only")
    cls = SGLANG_CLASSES.get(known_class(finding) or "")
    check = "resumed" if finding.get("oracle") == "resumed_state" else "hits"
    prompts = [[(s.segment, s.length) for s in r.prompt] for r in case.trace]
    return _TEST_TEMPLATE.substitute(
        doc_title=cls["title"] if cls else "a kvspec finding",
        config=_literal(
            {k: v for k, v in model_config_dict(case.deployment).items() if not k.startswith("_kvspec")},
            "case.deployment.model",
        ),
        flags=_literal(list(case.deployment.sglang_args), "case.deployment.sglang_args"),
        prompts=_literal(prompts, "case.trace"),
        expected=_literal(finding["expected"]["hits"], "expected.hits"),
        check=_literal(check, "check"),
    )


def bundle(finding: dict, *, matrix: list[dict] | None = None, finding_path: str = "FINDING.json") -> dict[str, str]:
    """{file name: text} of an SGLang finding's report bundle."""
    check_fields(finding)
    files = {"ISSUE.md": issue_markdown(finding, matrix=matrix, finding_path=finding_path)}
    try:
        files[f"test_{regression_test_name(finding)}.py"] = regression_test(finding)
    except ValueError:
        pass
    cls = SGLANG_CLASSES.get(known_class(finding) or "")
    if cls:
        fixes = [ROOT / f for f in cls["fix"] if (ROOT / f).is_file()]
        if fixes:
            files["fix.diff"] = "".join(p.read_text() for p in fixes)
    files["finding.json"] = json.dumps(finding, indent=2) + "\n"
    return files
