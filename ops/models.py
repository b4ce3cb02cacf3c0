"""Attention geometries of real models: the one table tests, the lowering check and the benchmark use.

Each entry is the q/k/v prologue of one model's attention layers as published in its Hugging
Face ``config.json`` (``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, the rotary
fraction and style, whether q/k are RMS-normalised and how, mRoPE sections, a gate beside q,
v-norm), each row citing the config it was read from. A model whose layer types differ in
geometry (Gemma-4: sliding and full attention, and KV-shared q-only layers) has one row per
layer type, named ``<model>:<layer type>``. :meth:`ModelSpec.shard` gives the geometry one rank
sees at a tensor-parallel size: q heads split evenly, kv heads split while there are enough,
replicated (one per rank) after that, as vLLM does; ``ModelSpec.tp_sizes`` lists the sizes of
:data:`TP_SIZES` vLLM can run the model at (all four unless its q heads forbid one).

No other module hard-codes a head count or head size: ask this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = [
    "BENCH_GEOMETRIES",
    "MLA_MODELS",
    "MODELS",
    "TP_SIZES",
    "AttentionGeometry",
    "MLASpec",
    "ModelSpec",
    "geometry_table",
    "mla_model",
    "mla_table",
    "model",
]

TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class AttentionGeometry:
    """One attention layer's prologue as one rank sees it.

    Attributes
    ----------
    num_q_heads, num_kv_heads, head_dim : int
        Heads of q and of k (= of v) on this rank, and the head size D.
    rotary_dim : int
        R: RoPE rotates dims ``[0, R)`` of each head; the rest pass through.
    is_neox : bool
        NeoX (rotate halves) or GPT-J (rotate adjacent pairs).
    qk_norm : bool
        Whether q and k are RMS-normalised per head before RoPE.
    weight_offset : float
        The norm multiplies by ``weight_offset + w`` (1.0 for Gemma-style norms).
    eps : float
        RMSNorm epsilon.
    q_gate : bool
        q's columns hold, per head, D values of q then D of the output gate (Qwen3-Next, Qwen3.5).
    v_norm : bool
        v's heads are RMS-normalised without a weight (Gemma-4).
    mrope_section : tuple of int, optional
        mRoPE's ``(t, h, w)`` frequency lanes per position axis, summing to ``R/2`` (Qwen-VL).
    mrope_interleaved : bool
        The sections are interleaved lane by lane (Qwen3-VL) rather than contiguous (Qwen2.5-VL).
    qk_norm_across_heads : bool
        q and k are RMS-normalised over all of their heads together (the whole hidden size of
        q, of k), not per head, with a weight of ``H*D`` values (MiniMax-M2's
        ``MiniMaxText01RMSNormTP``): under tensor parallelism the sum of squares spans ranks.
        Served by ``split_qkv_tp_rmsnorm_rope``, not by the per-head op; code that runs the
        per-head op on the table's rows must skip these or use that op.

    ``num_kv_heads == 0`` is a q-only layer (Gemma-4's KV-shared layers project q alone).
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    is_neox: bool = True
    qk_norm: bool = True
    weight_offset: float = 0.0
    eps: float = 1e-6
    q_gate: bool = False
    v_norm: bool = False
    mrope_section: tuple[int, int, int] | None = None
    mrope_interleaved: bool = False
    qk_norm_across_heads: bool = False

    @property
    def qkv_width(self) -> int:
        """Columns of the fused qkv projection output: ``(Hq*(2 if q_gate else 1) + 2*Hkv) * D``."""
        return ((2 if self.q_gate else 1) * self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def op_options(self) -> dict:
        """The op's keyword arguments this geometry sets beyond the shape, norm and style."""
        return dict(q_gate=self.q_gate, v_norm=self.v_norm, mrope_section=self.mrope_section,
                    mrope_interleaved=self.mrope_interleaved)

    @property
    def label(self) -> str:
        """Short name such as ``32/8/128`` or ``32/2/128 R64 gptj``."""
        text = f"{self.num_q_heads}/{self.num_kv_heads}/{self.head_dim}"
        if self.rotary_dim != self.head_dim:
            text += f" R{self.rotary_dim}"
        if not self.is_neox:
            text += " gptj"
        if not self.qk_norm:
            text += " nonorm"
        if self.weight_offset:
            text += f" w+{self.weight_offset:g}"
        if self.q_gate:
            text += " gate"
        if self.v_norm:
            text += " vnorm"
        if self.qk_norm_across_heads:
            text += " tpnorm"
        if self.mrope_section is not None:
            text += " mrope" + ("-i" if self.mrope_interleaved else "") + ":" + ",".join(map(str, self.mrope_section))
        return text


@dataclass(frozen=True)
class ModelSpec(AttentionGeometry):
    """A model's attention prologue before sharding: its whole-model geometry, a name and a note.

    The geometry fields are :class:`AttentionGeometry`'s (listed there only); ``name``, ``note``
    and ``tp_sizes`` (the sizes vLLM runs the model at: those of :data:`TP_SIZES` whose q heads
    it divides, and 16 where a row asks for it: MiniMax-M2) are keyword-only.
    """

    name: str = field(default="", kw_only=True)
    note: str = field(default="", kw_only=True)
    tp_sizes: tuple[int, ...] = field(default=TP_SIZES, kw_only=True)

    def shard(self, tp: int) -> AttentionGeometry:
        """The geometry one rank sees at tensor-parallel size ``tp``.

        Raises
        ------
        ValueError
            If ``tp`` does not divide the q heads, or the kv heads cannot be split or
            replicated evenly across ``tp`` ranks.
        """
        if tp < 1 or self.num_q_heads % tp:
            raise ValueError(f"tp={tp} does not divide {self.name}'s {self.num_q_heads} q heads")
        if self.num_kv_heads == 0:  # q-only layers stay q-only
            kv = 0
        elif self.num_kv_heads >= tp:
            if self.num_kv_heads % tp:
                raise ValueError(f"tp={tp} does not divide {self.name}'s {self.num_kv_heads} kv heads")
            kv = self.num_kv_heads // tp
        else:
            if tp % self.num_kv_heads:
                raise ValueError(f"{self.name}'s {self.num_kv_heads} kv heads cannot be replicated over tp={tp}")
            kv = 1
        whole = {f.name: getattr(self, f.name) for f in fields(AttentionGeometry)}
        return AttentionGeometry(**(whole | {"num_q_heads": self.num_q_heads // tp, "num_kv_heads": kv}))


def _spec(name: str, *geometry, note: str = "", **options) -> ModelSpec:
    """A table row: the name first, then :class:`AttentionGeometry`'s arguments."""
    return ModelSpec(*geometry, name=name, note=note, **options)


MODELS: tuple[ModelSpec, ...] = (
    _spec("Qwen3-8B", 32, 8, 128, 128, note="Qwen3 dense (also 4B); q/k RMSNorm"),
    _spec("Qwen3-32B", 64, 8, 128, 128, note="Qwen3 dense, largest"),
    _spec("Qwen3-30B-A3B", 32, 4, 128, 128, note="Qwen3 MoE"),
    _spec("Qwen3-235B-A22B", 64, 4, 128, 128, note="Qwen3 MoE, largest"),
    _spec("Llama-3.1-8B", 32, 8, 128, 128, qk_norm=False, eps=1e-5, note="no q/k norm"),
    _spec("Llama-3.1-70B", 64, 8, 128, 128, qk_norm=False, eps=1e-5, note="no q/k norm"),
    _spec(
        "GLM-4-9B", 32, 2, 128, 64, is_neox=False, qk_norm=False, eps=1.5625e-7,
        note="partial_rotary_factor 0.5, interleaved (GPT-J) rotary, no q/k norm",
    ),
    _spec(
        "Gemma-3-12B", 16, 8, 256, 256, weight_offset=1.0,
        note="D=256, q/k norm multiplies by (1 + w)",
    ),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_attention_heads=16, num_key_value_heads=2,
    # head_dim=256, partial_rotary_factor=0.25, rms_norm_eps=1e-06; no attn_output_gate key, and
    # vLLM's Qwen3NextAttention gates by default (getattr(config, "attn_output_gate", True));
    # q/k norm is Qwen3NextRMSNorm = GemmaRMSNorm, x * (1 + w).
    _spec(
        "Qwen3-Next-80B-A3B", 16, 2, 256, 64, weight_offset=1.0, q_gate=True,
        note="full-attention layers: D=256, partial rotary 0.25, (1 + w) q/k norm, gate beside each q head",
    ),
    _spec(
        "MiMo-V2-Flash-qk", 64, 4, 192, 64, eps=1e-5,
        note="D=192 with partial rotary (q/k geometry of MiMo-V2-Flash's full-attention "
        "layers; its V is 128 wide there, here V is D wide as the fused layout requires)",
    ),
    _spec("Phi-3-mini", 32, 32, 96, 96, qk_norm=False, eps=1e-5, note="D=96, MHA"),
    _spec("Phi-2", 32, 32, 80, 32, qk_norm=False, eps=1e-5, note="D=80, partial rotary 0.4"),
    # Qwen/Qwen2.5-VL-7B-Instruct config.json: hidden_size=3584, num_attention_heads=28,
    # num_key_value_heads=4 (head_dim = 3584/28 = 128), rms_norm_eps=1e-06,
    # rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}. The qkv projection has a bias
    # (vLLM's Qwen2 attention), added by the GEMM before the op. 28 q heads: vLLM refuses TP 8.
    _spec(
        "Qwen2.5-VL-7B", 28, 4, 128, 128, qk_norm=False, mrope_section=(16, 24, 24), tp_sizes=(1, 2, 4),
        note="mRoPE, contiguous sections t/h/w 16/24/24; no q/k norm (qkv bias is in the projection); "
        "28 q heads: no TP 8",
    ),
    # Qwen/Qwen3-VL-8B-Instruct config.json: text_config.num_attention_heads=32,
    # num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-06,
    # rope_scaling={"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"}.
    _spec(
        "Qwen3-VL-8B", 32, 8, 128, 128, mrope_section=(24, 20, 20), mrope_interleaved=True,
        note="Qwen3-VL dense: interleaved mRoPE 24/20/20, q/k RMSNorm",
    ),
    # Qwen/Qwen3-VL-30B-A3B-Instruct config.json: text_config.num_attention_heads=32,
    # num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-06, rope_scaling as Qwen3-VL-8B's.
    _spec(
        "Qwen3-VL-30B-A3B", 32, 4, 128, 128, mrope_section=(24, 20, 20), mrope_interleaved=True,
        note="Qwen3-VL MoE: interleaved mRoPE 24/20/20, q/k RMSNorm",
    ),
    # Qwen3.5 (model_type qwen3_5 / qwen3_5_moe; vLLM builds the full-attention layers with
    # Qwen3NextAttention: (1 + w) q/k norm, gate beside q). text_config of each config.json:
    # attn_output_gate=true, head_dim=256, rms_norm_eps=1e-06, rope_parameters={"mrope_interleaved":
    # true, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25, ...}, and
    # Qwen/Qwen3.5-27B: num_attention_heads=24, num_key_value_heads=4;
    # Qwen/Qwen3.5-35B-A3B: 16, 2; Qwen/Qwen3.5-397B-A17B: 32, 2;
    # Qwen/Qwen3.6-35B-A3B: 16, 2 (its text_config's attention keys are Qwen3.5-35B-A3B's).
    # Qwen3.6-27B is left out: its mRoPE keys were not found in a public copy of its config.
    _spec(
        "Qwen3.5-27B", 24, 4, 256, 64, weight_offset=1.0, q_gate=True, mrope_section=(11, 11, 10),
        mrope_interleaved=True, note="Qwen3.5 dense: gated q, (1 + w) norm, partial rotary 0.25, "
        "interleaved mRoPE 11/11/10",
    ),
    _spec(
        "Qwen3.5-35B-A3B", 16, 2, 256, 64, weight_offset=1.0, q_gate=True, mrope_section=(11, 11, 10),
        mrope_interleaved=True, note="Qwen3.5 MoE: Qwen3-Next's geometry with interleaved mRoPE",
    ),
    _spec(
        "Qwen3.5-397B-A17B", 32, 2, 256, 64, weight_offset=1.0, q_gate=True, mrope_section=(11, 11, 10),
        mrope_interleaved=True, note="Qwen3.5 MoE, largest",
    ),
    _spec(
        "Qwen3.6-35B-A3B", 16, 2, 256, 64, weight_offset=1.0, q_gate=True, mrope_section=(11, 11, 10),
        mrope_interleaved=True, note="same attention geometry as Qwen3.5-35B-A3B",
    ),
    # Gemma-4 (model_type gemma4, text_config gemma4_text; vLLM's Gemma4Attention): q/k RMSNorm
    # x * w (plain RMSNorm, no offset), weightless v-norm on every layer that projects k/v, NeoX
    # rotary. Sliding layers: head_dim, num_key_value_heads, rope_parameters.sliding_attention
    # (default RoPE, whole head). Full layers: global_head_dim, num_global_key_value_heads (when
    # attention_k_eq_v; v is then k's projection, still normalised), rope_parameters.full_attention
    # "proportional" with partial_rotary_factor 0.25: vLLM's Gemma4RotaryEmbedding rotates the
    # whole head with cos 1, sin 0 on the unrotated pairs, so the op sees R = D. The last
    # num_kv_shared_layers layers project q only (num_kv_heads=0 here).
    # google/gemma-4-31B-it config.json text_config: num_attention_heads=32, num_key_value_heads=16,
    # head_dim=256, global_head_dim=512, num_global_key_value_heads=4, attention_k_eq_v=true,
    # rms_norm_eps=1e-06; 60 layers, 5 sliding : 1 full; no KV-shared layers.
    _spec("Gemma-4-31B:sliding", 32, 16, 256, 256, v_norm=True, note="50 of 60 layers; v-norm"),
    _spec("Gemma-4-31B:full", 32, 4, 512, 512, v_norm=True,
          note="10 of 60 layers; D=512, proportional RoPE (R = D), v-norm, v = k's projection"),
    # google/gemma-4-26B-A4B-it config.json text_config: num_attention_heads=16,
    # num_key_value_heads=8, head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
    # attention_k_eq_v=true, rms_norm_eps=1e-06; 30 layers, 5 sliding : 1 full.
    _spec("Gemma-4-26B-A4B:sliding", 16, 8, 256, 256, v_norm=True, note="25 of 30 layers; v-norm"),
    _spec("Gemma-4-26B-A4B:full", 16, 2, 512, 512, v_norm=True,
          note="5 of 30 layers; D=512, proportional RoPE (R = D), v-norm"),
    # google/gemma-4-E2B-it config.json text_config: num_attention_heads=8, num_key_value_heads=1,
    # head_dim=256, global_head_dim=512, attention_k_eq_v=false, num_kv_shared_layers=20,
    # rms_norm_eps=1e-06; 35 layers, 4 sliding : 1 full; layers 15-34 share k/v (q only).
    _spec("Gemma-4-E2B:sliding", 8, 1, 256, 256, v_norm=True, note="12 of 35 layers; v-norm"),
    _spec("Gemma-4-E2B:full", 8, 1, 512, 512, v_norm=True, note="3 of 35 layers; D=512, R = D, v-norm"),
    _spec("Gemma-4-E2B:sliding-kv-shared", 8, 0, 256, 256,
          note="16 of 35 layers: q only (k/v from an earlier layer's cache)"),
    _spec("Gemma-4-E2B:full-kv-shared", 8, 0, 512, 512, note="4 of 35 layers: q only, D=512"),
    # MiniMax-M2 / MiniMax-M2.5 (model_type minimax_m2, MiniMaxM2ForCausalLM; M2.5 has the same
    # architecture): config.json hidden_size=3072, num_attention_heads=48, num_key_value_heads=8,
    # head_dim=128, rotary_dim=64 (partial rotary 0.5, NeoX: vLLM's get_rope default),
    # rms_norm_eps=1e-06, use_qk_norm=true, qk_norm_type="per_layer" (MiniMaxAI/MiniMax-M2 and
    # MiniMaxAI/MiniMax-M2.5 on Hugging Face; transformers 5.19 configuration_minimax_m2.py defaults
    # agree). vLLM 0.32 normalises q and k over all heads (MiniMaxText01RMSNormTP, weights of
    # 48*128 and 8*128 values sharded like the heads), so under TP the sum of squares is
    # all-reduced: split_qkv_tp_rmsnorm_rope. TP 16 runs with kv heads replicated x2.
    _spec("MiniMax-M2", 48, 8, 128, 64, qk_norm_across_heads=True, tp_sizes=(1, 2, 4, 8, 16),
          note="q/k RMSNorm over all heads (all-reduced under TP), partial rotary 0.5"),
    _spec("MiniMax-M2.5", 48, 8, 128, 64, qk_norm_across_heads=True, tp_sizes=(1, 2, 4, 8, 16),
          note="MiniMax-M2's attention geometry"),
)

#: (model, tp) of the benchmark's geometries: 32/8/128, 64/4/128, 8/1/128, Qwen3-Next's 16/2/256 R64
#: (1 + w) with its gated q (ungated before issue 10: the table's row was missing the gate), then
#: issue 10's Qwen3-VL-8B (32/8/128, interleaved mRoPE) and a Gemma-4 layer with v-norm (32/16/256).
BENCH_GEOMETRIES: tuple[tuple[str, int], ...] = (
    ("Qwen3-8B", 1),
    ("Qwen3-235B-A22B", 1),
    ("Qwen3-32B", 8),
    ("Qwen3-Next-80B-A3B", 1),
    ("Qwen3-VL-8B", 1),
    ("Gemma-4-31B:sliding", 1),
)


def model(name: str) -> ModelSpec:
    """The table entry called ``name`` (``ValueError`` listing the names when unknown)."""
    for spec in MODELS:
        if spec.name == name:
            return spec
    raise ValueError(f"unknown model {name!r}; known: {', '.join(m.name for m in MODELS)}")


def geometry_table(tp_sizes: tuple[int, ...] = TP_SIZES) -> list[tuple[str, int, AttentionGeometry]]:
    """Every ``(model name, tp, geometry)`` of the table at those of the given TP sizes each
    model runs at (``ModelSpec.tp_sizes``)."""
    return [(spec.name, tp, spec.shard(tp)) for spec in MODELS for tp in tp_sizes if tp in spec.tp_sizes]


@dataclass(frozen=True)
class MLASpec:
    """A model's multi-head latent attention prologue (``split_qkv_rmsnorm_rope_mla``, and
    ``mla_q_rope_`` after ``q_b_proj``), from its ``config.json``: ``q_lora_rank`` (0: no q latent,
    ``q_proj`` straight from the hidden state), ``kv_lora_rank``, ``qk_rope_head_dim``,
    ``qk_nope_head_dim``, ``num_attention_heads``, ``rms_norm_eps``; DeepSeek's rotary is GPT-J
    style (``is_neox_style=False``). Under tensor parallelism the q heads shard (``q_b_proj`` is
    column-parallel) and the latent does not (``fused_qkv_a_proj`` / ``kv_a_proj_with_mqa`` are
    replicated): the prologue's geometry is the same at every TP size."""

    name: str
    q_lora_rank: int
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    num_heads: int
    eps: float = 1e-6
    is_neox: bool = False
    note: str = ""
    tp_sizes: tuple[int, ...] = TP_SIZES + (16,)

    @property
    def q_head_dim(self) -> int:
        """Lanes of one q head after ``q_b_proj``: ``nope_dim + rope_dim``."""
        return self.nope_dim + self.rope_dim

    def heads_at(self, tp: int) -> int:
        """q heads one rank holds at tensor-parallel size ``tp`` (``ValueError`` unless it divides)."""
        if tp < 1 or self.num_heads % tp:
            raise ValueError(f"tp={tp} does not divide {self.name}'s {self.num_heads} heads")
        return self.num_heads // tp


MLA_MODELS: tuple[MLASpec, ...] = (
    # deepseek-ai/DeepSeek-V3 config.json: num_attention_heads=128, q_lora_rank=1536,
    # kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, rms_norm_eps=1e-06 (R1 the same).
    MLASpec("DeepSeek-V3", 1536, 512, 64, 128, 128, note="also R1, V3.1; q latent 1536 (the widest row we tile)"),
    # moonshotai/Kimi-K2-Instruct config.json: num_attention_heads=64, the same latent dims.
    MLASpec("Kimi-K2", 1536, 512, 64, 128, 64, note="DeepSeek-V3's MLA with 64 heads"),
    # deepseek-ai/DeepSeek-V2-Lite config.json: num_attention_heads=16, q_lora_rank=null,
    # kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, rms_norm_eps=1e-06.
    MLASpec("DeepSeek-V2-Lite", 0, 512, 64, 128, 16, note="no q latent (q_proj), no q_a norm"),
)


def mla_model(name: str) -> MLASpec:
    """The MLA table entry called ``name`` (``ValueError`` listing the names when unknown)."""
    for spec in MLA_MODELS:
        if spec.name == name:
            return spec
    raise ValueError(f"unknown MLA model {name!r}; known: {', '.join(m.name for m in MLA_MODELS)}")


def mla_table() -> list[tuple[str, int, MLASpec, int]]:
    """Every ``(model name, tp, spec, q heads per rank)`` of the MLA table at the TP sizes each runs at."""
    return [(spec.name, tp, spec, spec.heads_at(tp)) for spec in MLA_MODELS for tp in spec.tp_sizes]
