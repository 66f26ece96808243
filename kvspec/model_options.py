"""The deployment options of ``kvspec resolve`` and ``kvspec advise``: a
case file, or ``--model``: a shipped model name (or a config.json path)
with the engine's serve flags after ``--``, on a platform and a GPU, read
as a one-request deployment case."""

from __future__ import annotations

from ground.engines import DEFAULT_FAMILY, FAMILIES


def add_model_arguments(parser, *, case_help: str, model_help: str, device_help: str) -> None:
    """The deployment's two sources: a positional ``case`` file, or
    ``--model`` with ``--platform`` and ``--device`` (the flags after ``--``
    are the command's own positional ``flags``)."""
    parser.add_argument("case", nargs="?", help=case_help)
    parser.add_argument("--model", help=model_help)
    parser.add_argument(
        "--platform",
        choices=("cuda", "cpu"),
        default="cuda",
        help="with --model: where vLLM would run (default: %(default)s)",
    )
    parser.add_argument("--device", default=None, help=device_help)


def model_case(args, name: str, family: str = DEFAULT_FAMILY):
    """The deployment ``--model`` names, with a one-token trace (what a
    resolution needs); the flags go to ``family``'s serve-argument field
    (its registry entry's ``args_field``)."""
    from reference.case import parse_case

    flags = list(args.flags or [])
    dep = {"model": args.model, "vllm_args": flags, "platform": args.platform}
    if family != DEFAULT_FAMILY:
        dep = {"model": args.model, "engine": family, FAMILIES[family].args_field: flags, "platform": args.platform}
    if args.device is not None:
        dep["device"] = args.device
    return parse_case(
        {"schema": 1, "name": name, "deployment": dep, "trace": [{"prompt": [{"segment": "A", "length": 1}]}]}
    )
