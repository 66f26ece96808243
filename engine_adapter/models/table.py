"""The deployments of ``kvspec resolve --table``: every shipped model x
tensor parallelism x KV-cache dtype x MTP (where the model has an MTP
head), as ``vllm serve`` flags. Also the H200 device check's list."""

from __future__ import annotations

from engine_adapter.models.shipped import SHIPPED, load_config

TABLE_TP = (1, 2, 4, 8)
TABLE_DTYPES = ("auto", "fp8")
TABLE_SPEC = '{"method":"mtp","num_speculative_tokens":2}'


def table_deployments(device: str | None) -> list[dict]:
    """The table's deployments: shipped model x TP x KV dtype x MTP."""
    rows = []
    for model in SHIPPED:
        mtp = bool(load_config(model).get("num_nextn_predict_layers"))
        for tp in TABLE_TP:
            for dtype in TABLE_DTYPES:
                for spec in (False, True) if mtp else (False,):
                    args = ["--enable-prefix-caching", "--tensor-parallel-size", str(tp), "--kv-cache-dtype", dtype]
                    if spec:
                        args += ["--speculative-config", TABLE_SPEC]
                    dep = {"model": model, "vllm_args": args, "platform": "cuda"}
                    if device:
                        dep["device"] = device
                    rows.append({"model": model, "tp": tp, "dtype": dtype, "mtp": spec, "deployment": dep})
    return rows
