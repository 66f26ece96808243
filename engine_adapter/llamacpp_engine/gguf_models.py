"""Tiny random-weight GGUF models of real hybrid architectures, written
here by ``gguf``'s own writer (``gguf.GGUFWriter``), never downloaded.

Each model takes its layer pattern from the config kvspec ships
(``engine_adapter/models/<name>.json``: which layers are recurrent, which
attend) and scales the widths down (hidden 64, a few layers) so that a
4,000-token prompt prefills in well under a second on one CPU thread. The
weights are drawn from a seeded generator (``numpy.random.default_rng``),
so the same (architecture, seed) writes the same bytes; the file lives
under ``.kvspec/models/llamacpp/`` named by the sha256 of its recipe
(content-keyed), written atomically.

The tokenizer (``tokenizer.ggml.model = llama``) has one piece per id,
``<t{id}>``, for every id kvspec's segment streams draw
(``reference.tokens``: [1, TOKEN_VOCAB)) and the output token
(``OUTPUT_TOKEN``); kvspec sends token ids, so the mapping is one-to-one.

What llama.cpp asserts, found by loading (llama.cpp ``src/llama-model.cpp``
``load_hparams``/``load_tensors`` of each architecture): Mamba-2 layers need
``ssm.inner_size`` = 2 x embedding (granitehybrid, nemotron_h);
``attention.head_count_kv`` is per layer, 0 for a recurrent one.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

from reference.tokens import OUTPUT_TOKEN

#: The architectures kvspec writes: llama.cpp arch name -> shipped config.
ARCHITECTURES = {"granitehybrid": "granitemoehybrid", "nemotron_h": "nemotron_h", "qwen3next": "qwen3_next"}
#: Vocabulary: every segment id, the output token, then BOS and EOS.
BOS_ID = OUTPUT_TOKEN + 1
EOS_ID = OUTPUT_TOKEN + 2
N_VOCAB = OUTPUT_TOKEN + 16
#: Bumped whenever the writer changes what it writes (part of the key).
WRITER_VERSION = 1
_SHIPPED = Path(__file__).resolve().parents[1] / "models"


@dataclass(frozen=True)
class Recipe:
    """What a model file is made of: its key is the sha256 of this."""

    arch: str
    layers: tuple[str, ...]  # "recurrent" / "attention" / "mlp" per block
    n_embd: int = 64
    n_ff: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    d_state: int = 16
    d_conv: int = 4
    ssm_groups: int = 1
    ssm_heads: int = 8
    seed: int = 0
    writer: int = WRITER_VERSION

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def layer_pattern(arch: str, max_layers: int = 4) -> tuple[str, ...]:
    """The shipped config's layer kinds, scaled down: its blocks up to and
    including the first attention block, cut to ``max_layers`` (the
    attention block kept last), so the ratio recurrent:attention is the
    shipped one's where it fits."""
    cfg = json.loads((_SHIPPED / f"{ARCHITECTURES[arch]}.json").read_text())
    kinds = cfg.get("layer_types") or cfg.get("layers_block_type") or []
    out: list[str] = []
    for k in kinds:
        out.append(
            {
                "linear_attention": "recurrent",
                "full_attention": "attention",
                "mamba": "recurrent",
                "attention": "attention",
            }.get(k, "mlp")
        )
        if out[-1] == "attention":
            break
    if "attention" not in out:
        raise ValueError(
            f"model={arch!r}: the shipped config has no attention layer; allowed: {', '.join(ARCHITECTURES)}"
        )
    if arch != "nemotron_h":  # nemotron_h has MLP/MoE blocks of their own; the others fold the FFN into each block
        out = [k for k in out if k != "mlp"]
    if len(out) > max_layers:
        out = out[: max_layers - 1] + ["attention"]
        if arch == "nemotron_h":
            out = ["recurrent", "mlp", "attention"][:max_layers]
    return tuple(out)


def recipe(arch: str, seed: int = 0) -> Recipe:
    if arch not in ARCHITECTURES:
        raise ValueError(f"model={arch!r}: allowed: {', '.join(ARCHITECTURES)}")
    return Recipe(arch=arch, layers=layer_pattern(arch), seed=seed)


def models_dir() -> Path:
    from ground.home import kvspec_home

    return kvspec_home() / "models" / "llamacpp"


def model_path(arch: str, seed: int = 0) -> Path:
    """The model file of (arch, seed), written on first use (content-keyed)."""
    r = recipe(arch, seed)
    path = models_dir() / f"{r.arch}-{r.key()}.gguf"
    if not path.exists():
        from ground.files import write_bytes_atomic

        with tempfile.TemporaryDirectory(
            prefix="kvspec-gguf-"
        ) as tmp:  # gguf writes a path; kvspec's helper publishes it
            scratch = Path(tmp) / path.name
            write_model(r, scratch)
            write_bytes_atomic(path, scratch.read_bytes())
    return path


class _Tensors:
    def __init__(self, writer: gguf.GGUFWriter, seed: int) -> None:
        self.w, self.rng = writer, np.random.default_rng(seed)

    def add(self, name: str, *ne: int, scale: float | None = None, const: float | None = None) -> None:
        """A tensor of ggml shape ``ne`` (numpy's is the reverse), f32."""
        shape = tuple(reversed(ne))
        if const is not None:
            data = np.full(shape, const, dtype=np.float32)
        else:
            s = scale if scale is not None else 1.0 / np.sqrt(ne[0])
            data = (self.rng.standard_normal(shape) * s).astype(np.float32)
        self.w.add_tensor(name, data)


def _tokenizer(w: gguf.GGUFWriter) -> None:
    tokens = [f"<t{i}>".encode() for i in range(N_VOCAB)]
    types = [gguf.TokenType.NORMAL] * N_VOCAB
    types[0] = gguf.TokenType.UNKNOWN
    types[BOS_ID] = types[EOS_ID] = gguf.TokenType.CONTROL
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def write_model(r: Recipe, path: Path) -> None:
    """Write the GGUF file of ``r`` to ``path``."""
    w = gguf.GGUFWriter(str(path), r.arch)
    n_layer = len(r.layers)
    w.add_name(f"kvspec-tiny-{r.arch}")
    w.add_context_length(65536)
    w.add_embedding_length(r.n_embd)
    w.add_block_count(n_layer)
    w.add_head_count(r.n_head)
    # per layer, 0 for a recurrent one (granitehybrid, nemotron_h); qwen3next reads one number
    w.add_head_count_kv(
        r.n_head_kv if r.arch == "qwen3next" else [r.n_head_kv if k == "attention" else 0 for k in r.layers]
    )
    w.add_layer_norm_rms_eps(1e-5)
    if r.arch == "nemotron_h":
        w.add_layer_norm_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    d_inner = 2 * r.n_embd
    t = _Tensors(w, r.seed)
    t.add("token_embd.weight", r.n_embd, N_VOCAB, scale=1.0)
    t.add("output_norm.weight", r.n_embd, const=1.0)
    t.add("output.weight", r.n_embd, N_VOCAB)
    if r.arch in ("granitehybrid", "nemotron_h"):
        # nemotron_h tells a block's kind by its widths: n_head_kv > 0 attention, n_ff > 0 MLP, neither Mamba-2
        w.add_feed_forward_length([r.n_ff if k == "mlp" else 0 for k in r.layers] if r.arch == "nemotron_h" else r.n_ff)
        w.add_ssm_conv_kernel(r.d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(r.d_state)
        w.add_ssm_time_step_rank(r.ssm_heads)
        w.add_ssm_group_count(r.ssm_groups)
        w.add_key_length(r.head_dim)
        w.add_value_length(r.head_dim)
        if r.arch == "granitehybrid":
            w.add_attention_scale(1.0 / np.sqrt(r.head_dim))
            w.add_embedding_scale(1.0)
            w.add_residual_scale(1.0)
            w.add_logit_scale(1.0)
            w.add_rope_dimension_count(r.head_dim)
        for i, kind in enumerate(r.layers):
            b = f"blk.{i}"
            t.add(f"{b}.attn_norm.weight", r.n_embd, const=1.0)
            if kind == "recurrent":
                conv = d_inner + 2 * r.ssm_groups * r.d_state
                t.add(f"{b}.ssm_in.weight", r.n_embd, 2 * d_inner + 2 * r.ssm_groups * r.d_state + r.ssm_heads)
                t.add(f"{b}.ssm_conv1d.weight", r.d_conv, conv, scale=0.5)
                t.add(f"{b}.ssm_conv1d.bias", conv, scale=0.1)
                t.add(f"{b}.ssm_dt.bias", r.ssm_heads, scale=0.1)
                t.add(f"{b}.ssm_a", 1, r.ssm_heads, const=-1.0)
                t.add(f"{b}.ssm_d", 1, r.ssm_heads, const=1.0)
                t.add(f"{b}.ssm_norm.weight", d_inner // r.ssm_groups, r.ssm_groups, const=1.0)
                t.add(f"{b}.ssm_out.weight", d_inner, r.n_embd)
            elif kind == "attention":
                t.add(f"{b}.attn_q.weight", r.n_embd, r.n_head * r.head_dim)
                t.add(f"{b}.attn_k.weight", r.n_embd, r.n_head_kv * r.head_dim)
                t.add(f"{b}.attn_v.weight", r.n_embd, r.n_head_kv * r.head_dim)
                t.add(f"{b}.attn_output.weight", r.n_head * r.head_dim, r.n_embd)
            if r.arch == "granitehybrid":
                t.add(f"{b}.ffn_norm.weight", r.n_embd, const=1.0)
                t.add(f"{b}.ffn_gate.weight", r.n_embd, r.n_ff)
                t.add(f"{b}.ffn_up.weight", r.n_embd, r.n_ff)
                t.add(f"{b}.ffn_down.weight", r.n_ff, r.n_embd)
            elif kind == "mlp":
                t.add(f"{b}.ffn_up.weight", r.n_embd, r.n_ff)
                t.add(f"{b}.ffn_down.weight", r.n_ff, r.n_embd)
    else:
        _qwen3next(w, t, r)
    _tokenizer(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _qwen3next(w, t: _Tensors, r: Recipe) -> None:
    """Gated DeltaNet + gated full attention (every ``full_attention_interval``-th
    layer attends), MoE FFN with a shared expert in every layer."""
    n_v, n_k, dk, dv = r.ssm_heads // 2, r.ssm_groups * 2, r.d_state, r.d_state
    key_dim, value_dim = n_k * dk, n_v * dv
    n_exp, n_used, ff_exp = 4, 2, r.n_ff // 2
    w.add_full_attention_interval(r.layers.index("attention") + 1)
    w.add_ssm_conv_kernel(r.d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(dk)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_group_count(n_k)
    w.add_key_length(r.head_dim)
    w.add_value_length(r.head_dim)
    w.add_rope_dimension_count(r.head_dim // 4)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(ff_exp)
    w.add_expert_shared_feed_forward_length(ff_exp)
    w.add_feed_forward_length(r.n_ff)
    for i, kind in enumerate(r.layers):
        b = f"blk.{i}"
        t.add(f"{b}.attn_norm.weight", r.n_embd, const=1.0)
        t.add(f"{b}.post_attention_norm.weight", r.n_embd, const=1.0)
        if kind == "recurrent":
            conv = 2 * key_dim + value_dim
            t.add(f"{b}.ssm_in.weight", r.n_embd, 2 * key_dim + 2 * value_dim)
            t.add(f"{b}.ssm_ba.weight", r.n_embd, 2 * n_v)
            t.add(f"{b}.ssm_conv1d.weight", r.d_conv, conv, scale=0.5)
            t.add(f"{b}.ssm_dt.bias", n_v, scale=0.1)
            t.add(f"{b}.ssm_a", n_v, const=-1.0)
            t.add(f"{b}.ssm_norm.weight", dv, const=1.0)
            t.add(f"{b}.ssm_out.weight", value_dim, r.n_embd)
        else:
            t.add(f"{b}.attn_q.weight", r.n_embd, 2 * r.n_head * r.head_dim)
            t.add(f"{b}.attn_k.weight", r.n_embd, r.n_head_kv * r.head_dim)
            t.add(f"{b}.attn_v.weight", r.n_embd, r.n_head_kv * r.head_dim)
            t.add(f"{b}.attn_q_norm.weight", r.head_dim, const=1.0)
            t.add(f"{b}.attn_k_norm.weight", r.head_dim, const=1.0)
            t.add(f"{b}.attn_output.weight", r.n_head * r.head_dim, r.n_embd)
        t.add(f"{b}.ffn_gate_inp.weight", r.n_embd, n_exp)
        t.add(f"{b}.ffn_gate_exps.weight", r.n_embd, ff_exp, n_exp)
        t.add(f"{b}.ffn_up_exps.weight", r.n_embd, ff_exp, n_exp)
        t.add(f"{b}.ffn_down_exps.weight", ff_exp, r.n_embd, n_exp)
        t.add(f"{b}.ffn_gate_inp_shexp.weight", r.n_embd)
        t.add(f"{b}.ffn_gate_shexp.weight", r.n_embd, ff_exp)
        t.add(f"{b}.ffn_up_shexp.weight", r.n_embd, ff_exp)
        t.add(f"{b}.ffn_down_shexp.weight", ff_exp, r.n_embd)
