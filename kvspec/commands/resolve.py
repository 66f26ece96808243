"""kvspec resolve CASE --engine vllm==X [--json] | --model M [--platform P] [--device D] --engine vllm==X -- FLAGS | --table [--engine ...] [--markdown]

What vLLM builds for a deployment, resolved by vLLM's own code in the engine
environment of that version (``engine_adapter.vllm_engine.resolve``): the geometry
(groups, scheduler / hash / Mamba block, retention, chunk budget, internal
prefill checkpoints), the speculative settings, the knobs the reference
model reads, the facts behind them (attention backend, GDN prefill kernel,
padded Mamba page, ...) and the assumptions kvspec made (the hardware
answers). A hand-geometry case gets its reachability instead: whether it
breaks a rule every vLLM deployment obeys (``reference.reachability``).

``--table`` resolves every shipped model x tensor parallel {1, 2, 4, 8} x KV
dtype {auto, fp8} x MTP {off, 2 tokens} (MTP only for models with an MTP
layer) on each ``--engine``, on an H100 unless ``--device`` says otherwise.

Exit status: 0 resolved (or a reachable / not contradicted hand geometry);
1 a hand geometry no deployment reaches; 2 bad input or vLLM rejected the
deployment (vLLM's own message, one line).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from engine_adapter.models.served import check_case_model
from ground.engines import DEFAULT_FAMILY, FAMILIES, load
from ground.errors import KvspecError, invalid
from kvspec.epilog import set_epilog
from kvspec.model_options import add_model_arguments, model_case
from kvspec.switches import add_switches

if TYPE_CHECKING:
    from engine_adapter.host.versions import EngineSpec

HELP = "what the engine builds for a deployment (model + vllm serve or sglang serve flags), or whether a hand geometry is reachable"


def configure(parser) -> None:
    set_epilog(
        parser,
        "exit status: 0 resolved; 1 a hand geometry no deployment reaches; 2 bad input or vLLM rejected the deployment",
    )
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(
        parser,
        metavar="vllm==X",
        help="vLLM version(s) to resolve with (default: vllm==0.33.0); also a build: vllm==X --patch FILE.diff, vllm==X+LABEL.HASH, path:DIR, wheel:FILE.whl",
    )
    add_model_arguments(
        parser,
        case_help="a case or finding file (a deployment case, or a hand geometry for its reachability)",
        model_help="a shipped model name or a config.json path (instead of CASE); flags after --",
        device_help="with --model or --table on cuda: the GPU (h100, h200, a100, b200; default h100)",
    )
    add_switches(
        parser,
        {
            "--table": "the shipped models x TP x KV dtype x MTP table",
            "--markdown": "with --table: a markdown table",
            "--json": "print JSON",
        },
    )
    parser.add_argument("flags", nargs="*", help="after --: vllm serve flags (with --model)")


def _deployment_case(args, family: str = DEFAULT_FAMILY):
    return model_case(args, "resolve", family)


def main(args) -> int:
    from engine_adapter.host.versions import DEFAULT_ENGINE
    from kvspec.engine_options import engine_specs

    engines = engine_specs(args, default=DEFAULT_ENGINE)  # each name parsed once, there
    if args.table:
        if args.case or args.model:
            raise invalid("--table", True, "takes no CASE and no --model")
        return _table(engines, args)
    if args.model is not None and args.case is not None:  # argparse put the first flag after -- here
        args.flags = [args.case, *(args.flags or [])]
        args.case = None
    if (args.case is None) == (args.model is None):
        raise invalid("CASE", args.case, "give a case file or --model (with vllm serve flags after --), not both")
    if args.case is None and args.flags is None:
        args.flags = []
    if args.case is not None and args.flags:
        raise invalid("flags", args.flags, "vllm serve flags go with --model only")
    if args.case is not None:
        from fuzz.results.findings import load_finding

        case, _ = load_finding(args.case)
    else:
        families = {spec.family for spec in engines}
        if len(families) > 1:
            raise invalid(
                "--engine",
                [spec.name for spec in engines],
                "with --model the flags after -- are one engine's; allowed: engines of one family",
            )
        case = _deployment_case(args, families.pop())
    check_case_model(case)  # a config naming code: one line before any engine starts
    if case.deployment is None:
        return _reachability(case, engines, args)
    from engine_adapter import open_engine
    from engine_adapter.host import warm

    results = []
    for spec in engines:
        with open_engine(spec, warm=warm.enabled()) as engine:
            results.append(engine.resolve(case))
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
        return 0
    for r in results:
        _render(r)
    return 0


def _render(r: dict) -> None:
    printer = FAMILIES.get(r.get("engine_family") or DEFAULT_FAMILY, FAMILIES[DEFAULT_FAMILY]).resolve_printer
    if printer is not None:  # the family prints its own resolution (its own field names)
        return load(printer)(r)
    g, f = r["geometry"], r["facts"]
    groups = ", ".join(f"{x['count']}x {x['kind']} {x['block_size']}" for x in g["groups"])
    print(
        f"{r['engine']}  {r['deployment']['model']} on {f['platform']}" + (f"/{f['device']}" if f.get("device") else "")
    )
    print(f"  groups:            {groups}")
    print(
        f"  scheduler block:   {g['scheduler_block_size']}   hash block: {g['hash_block_size']}   hit alignment: {f.get('cache_hit_alignment_tokens')}"
    )
    print(
        f"  Mamba block:       {f.get('mamba_block_size')}   padded Mamba page: {f.get('mamba_page_size_padded')}   mode: {f.get('mamba_cache_mode')}"
    )
    print(
        f"  retention:         {g['retention_interval']}   chunk budget: {g['max_num_batched_tokens']}   max_model_len: {f.get('max_model_len')}"
    )
    print(
        f"  prefill checkpoints: {g.get('prefill_checkpoint_grid')}   shared-prefix checkpoint: {g.get('shared_prefix_checkpoint')}"
    )
    print(f"  speculative:       {json.dumps(r['speculative'])}   hash lookahead: {f.get('num_hash_lookahead_tokens')}")
    print(
        f"  attention backend: {f.get('attention_backend')}   GDN prefill: {f.get('gdn_prefill_backend')}   TP: {f.get('tensor_parallel_size')}   KV dtype: {f.get('cache_dtype')}"
    )
    print("  reachable:         yes (vLLM built it)")
    for a in r.get("assumptions", []):
        print(f"  assumption:        {a}")


def _render_sglang(r: dict) -> None:
    """What SGLang resolved (its own field names), and the geometry the
    promise reads (or that it is not stated for this cache)."""
    g = r.get("geometry")
    print(f"{r['engine']}  {r['deployment']['model']} (SGLang's ServerArgs pipeline, as on CUDA)")
    print(
        f"  strategy:          {r['mamba_radix_cache_strategy']}   extra buffer: {r['extra_buffer']}   page: {r['page_size']}"
    )
    print(f"  chunked prefill:   {r['chunked_prefill_size']}   max prefill tokens: {r['max_prefill_tokens']}")
    print(
        f"  Mamba chunk:       {r['mamba_cache_chunk_size']}   checkpoint grid: {r['checkpoint_grid']}   track grid: {r['track_grid']} (interval {r['mamba_track_interval']})"
    )
    print(
        f"  states per path:   {r['mamba_max_states_per_path']}   speculative: {r['speculative_algorithm']} ({r['speculative_num_draft_tokens']} draft tokens)"
    )
    if g:
        print(
            f"  the promise reads: block {g['scheduler_block_size']} (full attention and Mamba), chunk budget {g['max_num_batched_tokens']}"
        )
    else:
        print(
            "  the promise reads: nothing: not stated for this cache (no_buffer keeps a state only where a prefill ends; a states-per-path cap drops them by design)"
        )


def _reachability(case, engines, args) -> int:
    from reference.reachability import reachability

    rows = [{"engine": spec.name, **reachability(case, spec.version, args.platform)} for spec in engines]
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=2))
    else:
        for r in rows:
            verdict = {True: "reachable", False: "NOT reachable", None: "not contradicted"}[r["reachable"]]
            print(f"{r['engine']}: hand geometry {verdict}: {r['reason']}")
    return 1 if any(r["reachable"] is False for r in rows) else 0


def _table(specs: list[EngineSpec], args) -> int:
    from engine_adapter import open_engine
    from engine_adapter.host import warm
    from engine_adapter.models.table import table_deployments
    from reference.case import parse_case

    plan = table_deployments(args.device)
    cells: dict[tuple, dict] = {}
    engines = [spec.name for spec in specs]
    for spec, name in zip(specs, engines):
        with open_engine(spec, warm=warm.enabled()) as engine:
            for row in plan:
                case = parse_case(
                    {
                        "schema": 1,
                        "deployment": row["deployment"],
                        "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
                    }
                )
                key = (name, row["model"], row["tp"], row["dtype"], row["mtp"])
                try:
                    r = engine.resolve(case)
                    g, f = r["geometry"], r["facts"]
                    cells[key] = {
                        "scheduler": g["scheduler_block_size"],
                        "hash": g["hash_block_size"],
                        "mamba": f.get("mamba_block_size"),
                        "alignment": f.get("cache_hit_alignment_tokens") or g["scheduler_block_size"],
                        "grid": g.get("prefill_checkpoint_grid"),
                    }
                except KvspecError as e:
                    cells[key] = {"error": " ".join(str(e).split())[:160]}
    if args.json:
        print(
            json.dumps(
                [
                    {"engine": k[0], "model": k[1], "tp": k[2], "kv_dtype": k[3], "mtp": k[4], **v}
                    for k, v in cells.items()
                ],
                indent=2,
            )
        )
        return 0
    header = ["model", "TP", "KV dtype", "MTP", *engines]
    lines = []
    for row in plan:
        cols = [row["model"], str(row["tp"]), row["dtype"], "2" if row["mtp"] else "off"]
        for name in engines:
            c = cells[(name, row["model"], row["tp"], row["dtype"], row["mtp"])]
            if "error" in c:
                cols.append("rejected")
            else:
                text = f"{c['scheduler']}/{c['hash']}/{c['mamba']}/{c['alignment']}"
                if c.get("grid"):
                    text += f" ckpt {c['grid']}"
                cols.append(text)
        lines.append(cols)
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cols in lines:
            print("| " + " | ".join(cols) + " |")
    else:
        from rich.table import Table

        from ground.console import table_console

        t = Table(
            title=f"scheduler/hash/Mamba block/hit alignment ({args.device or 'h100'}); 'ckpt g': internal prefill checkpoints on grid g"
        )
        for h in header:
            t.add_column(h)
        for cols in lines:
            t.add_row(*cols)
        table_console().print(t)
    rejected = sorted({(k[0], k[1], v["error"]) for k, v in cells.items() if "error" in v})
    for engine, model, err in rejected[:10]:
        print(f"  {engine} {model}: {err}")
    return 0
