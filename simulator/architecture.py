"""What a transformer is made of, in the numbers that decide its memory and FLOPs.

Parameter counts are derived from the shapes (not typed in) so they can be checked against
the publisher's figure, and the same shapes give the GEMMs the step cost model prices.

A model has two kinds of decoder layer: a dense layer (attention + one MLP) and, in a
mixture-of-experts model, an MoE layer (attention + router + routed experts + optional
shared experts). Which layers are MoE follows the two conventions the published configs
use: DeepSeek's first `first_dense_layers` dense layers, and a period `moe_layer_step`
(Llama 4's interleave, Qwen's decoder_sparse_step): layer i is MoE when
i >= first_dense_layers and (i - first_dense_layers + 1) % moe_layer_step == 0.
Attention is grouped-query (GQA/MQA/MHA) or DeepSeek's multi-head latent attention (MLA,
set by kv_lora_rank); with a sliding window, `full_attention_interval` makes every n-th
layer full attention (Gemma 2: 2, Gemma 3: 6, gpt-oss: 2).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_models.dtypes import Dtype, bytes_per_element
from hardware_models.errors import InfersimError

Gemm = tuple[str, int, int, int]
"""(name, m, n, k): an (m x k) @ (k x n) matrix multiply."""

LayerGemm = tuple[str, int, int, int, int]
"""(name, m, n, k, layers): a GEMM and how many layers of the model run it per step."""

_MLA_FIELDS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class ModelArchitecture(BaseModel):
    """A decoder-only transformer (dense or MoE). Validated strictly: unknown fields fail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="catalog id")
    display_name: str
    family: str = Field(description="HF model_type: llama, mistral, mixtral, qwen2, ...")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(
        gt=0, description="dense MLP width (and each expert's when moe_intermediate_size is unset)"
    )
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0, description="= heads for MHA, < heads for GQA, 1 for MQA")
    head_dim: int = Field(gt=0, description="defaults to hidden_size // num_attention_heads")
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = False
    gated_mlp: bool = Field(default=True, description="SwiGLU/GeGLU: gate, up and down matrices")
    mlp_bias: bool = Field(default=False, description="biases on the MLP/expert matrices (gpt-oss)")
    # ---- mixture of experts ----
    num_experts: int = Field(default=1, ge=1, description="routed experts per MoE layer; 1 = dense")
    experts_per_token: int = Field(default=1, ge=1, description="top-k routed experts per token")
    moe_intermediate_size: int | None = Field(
        default=None, gt=0, description="each routed expert's width (default intermediate_size)"
    )
    num_shared_experts: int = Field(default=0, ge=0, description="experts every token passes")
    shared_expert_intermediate_size: int | None = Field(
        default=None, gt=0, description="each shared expert's width (default: a routed expert's)"
    )
    first_dense_layers: int = Field(
        default=0,
        ge=0,
        description="leading layers with a dense MLP (DeepSeek first_k_dense_replace)",
    )
    moe_layer_step: int = Field(
        default=1, ge=1, description="every n-th layer after those is MoE (Llama 4 interleave)"
    )
    # ---- attention ----
    q_lora_rank: int | None = Field(default=None, gt=0, description="MLA query compression rank")
    kv_lora_rank: int | None = Field(
        default=None, gt=0, description="MLA latent KV width; set = multi-head latent attention"
    )
    qk_nope_head_dim: int | None = Field(
        default=None, gt=0, description="MLA per-head q/k part without RoPE"
    )
    qk_rope_head_dim: int | None = Field(
        default=None, gt=0, description="MLA shared RoPE key width"
    )
    v_head_dim: int | None = Field(default=None, gt=0, description="MLA per-head value width")
    sliding_window: int | None = Field(default=None, gt=0)
    full_attention_interval: int | None = Field(
        default=None,
        ge=2,
        description="with sliding_window: every n-th layer attends fully (unset: all slide)",
    )
    qk_norm: bool = Field(
        default=False, description="RMSNorm over each head's q and k (Qwen3, Gemma 3)"
    )
    norms_per_layer: int = Field(
        default=2,
        ge=1,
        description="2 = pre-attention and pre-MLP; Gemma 2/3 also norm both outputs (4)",
    )
    attention_sinks: bool = Field(
        default=False, description="one learned sink logit per head (gpt-oss)"
    )
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    attention_bias: bool = Field(default=False, description="bias on the Q, K, V projections")
    published_params_b: float | None = Field(
        default=None, gt=0, description="the publisher's total parameter count, billions"
    )
    published_active_params_b: float | None = Field(
        default=None, gt=0, description="the publisher's parameters active per token, billions"
    )
    source: str = Field(min_length=1)
    checkpoint_dtype: Literal["bf16", "fp16", "fp8", "fp8_block", "int4", "fp4", "nvfp4"] | None = (
        Field(
            default=None,
            description="the weight format the published checkpoint is stored in (its "
            "quantization_config): fp8_block for DeepSeek-V3, fp4 (MXFP4 experts) for gpt-oss; "
            "model.weight_dtype follows it unless set, as vLLM serves the checkpoint as stored",
        )
    )
    unquantized: dict[str, tuple[int, ...]] = Field(
        default_factory=dict,
        description="the layers (from 0) whose GEMM of that name (qkv_proj, o_proj, gate_up, "
        "down, shared.gate_up, ...: gemms' names) a quantised checkpoint keeps in 16 bits "
        "(its modules_to_not_convert, ignore or exclude_modules): Meta's FP8 Llama 3.1 405B "
        "keeps every attention and the first and last MLP",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("head_dim") is None:
            hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
            if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
                if hidden % heads:
                    raise ValueError(
                        f"hidden_size ({hidden}) is not divisible by num_attention_heads "
                        f"({heads}); give head_dim explicitly"
                    )
                data = {**data, "head_dim": hidden // heads}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelArchitecture:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds num_experts "
                f"({self.num_experts})"
            )
        if self.is_moe and self.num_moe_layers == 0:
            raise ValueError(
                f"first_dense_layers ({self.first_dense_layers}) and moe_layer_step "
                f"({self.moe_layer_step}) leave no MoE layer among {self.num_layers}"
            )
        if self.kv_lora_rank is not None:
            missing = [f for f in _MLA_FIELDS if getattr(self, f) is None]
            if missing:
                raise ValueError(f"kv_lora_rank (MLA) needs {', '.join(missing)}")
        elif self.q_lora_rank is not None or any(getattr(self, f) for f in _MLA_FIELDS):
            raise ValueError(f"q_lora_rank and {', '.join(_MLA_FIELDS)} need kv_lora_rank (MLA)")
        if self.full_attention_interval is not None and self.sliding_window is None:
            raise ValueError("full_attention_interval needs sliding_window")
        self._check_unquantized()
        return self

    def _check_unquantized(self) -> None:
        """Each unquantized GEMM is one of the model's, in layers that run it."""
        runs = {name: layers for name, *_, layers in self.gemms(1) if name != "router"}
        for name, layers in self.unquantized.items():
            if name not in runs:
                raise ValueError(
                    f"unquantized: {name!r} is not a GEMM of this model "
                    f"(its GEMMs: {', '.join(runs)})"
                )
            wrong = [i for i in layers if not self._runs_gemm(name, i)]
            if wrong or len(set(layers)) != len(layers):
                raise ValueError(
                    f"unquantized: {name} lists layers {wrong or sorted(layers)} that do "
                    "not run it or repeat"
                )

    def _runs_gemm(self, name: str, index: int) -> bool:
        """Whether layer `index` runs the GEMM `name` (gemms: the dense MLP in dense
        layers, the shared experts in MoE layers, attention everywhere)."""
        if not 0 <= index < self.num_layers:
            return False
        if name.startswith("shared."):
            return self.is_moe_layer(index)
        if name in ("gate_up", "up", "down"):
            return not self.is_moe_layer(index)
        return True

    def unquantized_layers(self, name: str, layers: range | None = None) -> int:
        """How many of `layers` (default all) keep GEMM `name` in 16 bits in the checkpoint."""
        kept = self.unquantized.get(name, ())
        return len(kept) if layers is None else sum(i in layers for i in kept)

    # ---- layer kinds -----------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (from 0) has routed experts."""
        after = index - self.first_dense_layers
        return self.is_moe and after >= 0 and (after + 1) % self.moe_layer_step == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_sliding_layer(self, index: int) -> bool:
        """Whether layer `index` attends only to the last sliding_window keys."""
        if self.sliding_window is None:
            return False
        interval = self.full_attention_interval
        return interval is None or (index + 1) % interval != 0

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.is_sliding_layer(i) for i in range(self.num_layers))

    # ---- shapes ----------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the query projection output (all heads)."""
        if self.is_mla:
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection output; smaller than q_dim under GQA/MQA."""
        return self.num_kv_heads * self.head_dim

    @property
    def o_dim(self) -> int:
        """Width of the attention output that o_proj reads (all heads' values)."""
        if self.is_mla:
            return self.num_attention_heads * self.v_head_dim
        return self.q_dim

    @property
    def mla_latent_dim(self) -> int:
        """MLA: what one token stores per layer, the latent plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.is_mla else 0

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def shared_intermediate_size(self) -> int:
        """Total width of the shared experts (they run as one dense MLP)."""
        each = self.shared_expert_intermediate_size or self.expert_intermediate_size
        return self.num_shared_experts * each

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def mlp_matrix_params(self, inter: int) -> int:
        """The weight matrices of one MLP (or expert) `inter` wide, biases aside."""
        return self._mlp_matrices * self.hidden_size * inter

    def _mlp_params(self, inter: int) -> int:
        bias = (self._mlp_matrices - 1) * inter + self.hidden_size if self.mlp_bias else 0
        return self.mlp_matrix_params(inter) + bias

    # ---- parameter counts ------------------------------------------------------------
    @property
    def attention_linear_params(self) -> int:
        """The attention's weight matrices in one layer (what weight quantisation applies to)."""
        h = self.hidden_size
        if not self.is_mla:
            return 2 * h * self.q_dim + 2 * h * self.kv_dim
        q = h * self.q_dim if self.q_lora_rank is None else (h + self.q_dim) * self.q_lora_rank
        kv_a = h * self.mla_latent_dim
        kv_b = (
            self.kv_lora_rank * self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim)
        )
        return q + kv_a + kv_b + self.o_dim * h

    @property
    def attention_other_params(self) -> int:
        """QKV bias, q/k norms, MLA's latent norms and attention sinks in one layer."""
        bias = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        latent_norms = (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)
        sinks = self.num_attention_heads if self.attention_sinks else 0
        return bias + qk_norm + latent_norms + sinks

    @property
    def attention_params_per_layer(self) -> int:
        return self.attention_linear_params + self.attention_other_params

    @property
    def dense_mlp_params(self) -> int:
        """The MLP of a dense layer."""
        return self._mlp_params(self.intermediate_size)

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up, down (or up, down when not gated)."""
        return self._mlp_params(self.expert_intermediate_size)

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer."""
        return self._mlp_params(self.shared_intermediate_size) if self.num_shared_experts else 0

    @property
    def router_params_per_layer(self) -> int:
        """The MoE gate (hidden -> num_experts logits); zero for dense models."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def moe_mlp_params(self) -> int:
        """Everything after the attention in an MoE layer: what must sit in memory."""
        return (
            self.num_experts * self.expert_params
            + self.shared_expert_params
            + self.router_params_per_layer
        )

    @property
    def _norm_params(self) -> int:
        return self.hidden_size * (1 if self.norm == "rmsnorm" else 2)

    @property
    def norm_params_per_layer(self) -> int:
        """The layer's norms over the hidden state (LayerNorm also has a bias)."""
        return self.norms_per_layer * self._norm_params

    @property
    def final_norm_params(self) -> int:
        return self._norm_params

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params_per_layer + self.dense_mlp_params + self.norm_params_per_layer

    @property
    def moe_layer_params(self) -> int:
        return self.attention_params_per_layer + self.moe_mlp_params + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Zero when tied: the head reuses the embedding matrix."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        """Total parameters, comparable with the publisher's figure."""
        return (
            self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * self.moe_layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

    @property
    def inactive_params_per_moe_layer(self) -> int:
        return (self.num_experts - self.experts_per_token) * self.expert_params

    def active_param_count(self) -> int:
        """Parameters one token touches (MoE: its top-k experts), embedding table included
        (Mistral's convention: 12.9B for Mixtral 8x7B; OpenAI's gpt-oss figures leave the
        input embedding out)."""
        return self.param_count() - self.num_moe_layers * self.inactive_params_per_moe_layer

    # ---- KV cache --------------------------------------------------------------------
    def kv_elements_per_token_layer(self) -> int:
        """Elements one token stores in one layer: K and V of each KV head, or MLA's one
        latent (shared by all heads, so it is not split over TP ranks)."""
        return self.mla_latent_dim if self.is_mla else 2 * self.kv_dim

    def kv_bytes_per_token(self, kv_dtype: str | Dtype = Dtype.BF16) -> float:
        """KV of one token over all layers: what the cache grows by per token while the
        context is within any sliding window."""
        return self.num_layers * self.kv_elements_per_token_layer() * bytes_per_element(kv_dtype)

    # ---- tensor parallelism ----------------------------------------------------------
    def check_tp(self, tp: int) -> None:
        """Raise unless heads split evenly over tp and KV heads split or replicate evenly."""
        if tp < 1:
            raise InfersimError(f"tp must be >= 1, got {tp}")
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if heads % tp:
            raise InfersimError(
                f"{self.name}: num_attention_heads ({heads}) is not divisible by tp={tp}"
            )
        if not self.is_mla and ((tp <= kv and kv % tp) or (tp > kv and tp % kv)):
            raise InfersimError(
                f"{self.name}: num_kv_heads ({kv}) and tp={tp} must divide one another "
                "(KV heads are split when tp <= kv heads, replicated when tp > kv heads)"
            )

    def kv_heads_per_shard(self, tp: int) -> int:
        """KV heads held by one TP rank; replicated (1 per rank) when tp > num_kv_heads."""
        self.check_tp(tp)
        return max(1, self.num_kv_heads // tp)

    def kv_elements_per_token_layer_shard(self, tp: int) -> int:
        """kv_elements_per_token_layer() on one TP rank (MLA's latent is replicated)."""
        if self.is_mla:
            self.check_tp(tp)
            return self.mla_latent_dim
        return 2 * self.kv_heads_per_shard(tp) * self.head_dim

    def attention_gemms(self, tokens: int, tp: int = 1) -> list[Gemm]:
        """The attention projections of one layer on one TP rank, as (name, m, n, k).

        MLA's down-projections (q_a and kv_a, fused as vLLM does) are replicated on every
        rank; its up-projections split their heads. kv_b costs the same FLOPs and weight
        bytes whether it decompresses the cache (prefill) or is absorbed into the query
        and output (decode), so one GEMM stands for both.
        """
        h, heads = self.hidden_size, self.num_attention_heads // tp
        if not self.is_mla:
            kv = self.kv_heads_per_shard(tp) * self.head_dim
            return [
                ("qkv_proj", tokens, self.q_dim // tp + 2 * kv, h),
                ("o_proj", tokens, h, self.q_dim // tp),
            ]
        self.check_tp(tp)
        q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        gemms: list[Gemm] = []
        if self.q_lora_rank is None:
            gemms.append(("q_proj", tokens, heads * q_head, h))
            gemms.append(("kv_a_proj", tokens, self.mla_latent_dim, h))
        else:
            gemms.append(("qkv_a_proj", tokens, self.q_lora_rank + self.mla_latent_dim, h))
            gemms.append(("q_b_proj", tokens, heads * q_head, self.q_lora_rank))
        kv_b = heads * (self.qk_nope_head_dim + self.v_head_dim)
        gemms.append(("kv_b_proj", tokens, kv_b, self.kv_lora_rank))
        gemms.append(("o_proj", tokens, h, heads * self.v_head_dim))
        return gemms

    def _mlp_gemms(self, prefix: str, tokens: int, inter: int) -> list[Gemm]:
        up_name, up_n = ("gate_up", 2 * inter) if self.gated_mlp else ("up", inter)
        return [
            (prefix + up_name, tokens, up_n, self.hidden_size),
            (prefix + "down", tokens, self.hidden_size, inter),
        ]

    def gemms(self, tokens: int, tp: int = 1) -> list[LayerGemm]:
        """Every GEMM of a step over `tokens` tokens on one TP rank except the routed
        experts (priced as one fused MoE kernel) and the LM head, as (name, m, n, k,
        layers): attention projections in every layer, the dense MLP in dense layers, and
        the router and shared experts (dense, tensor-parallel) in MoE layers.

        Column-parallel projections (qkv_proj, gate_up/up) split n over tp; row-parallel
        ones (o_proj, down) split k.
        """
        if tokens < 1:
            raise InfersimError(f"tokens must be >= 1, got {tokens}")
        out = [(*g, self.num_layers) for g in self.attention_gemms(tokens, tp)]
        dense, moe = self.num_dense_layers, self.num_moe_layers
        if dense:
            inter = math.ceil(self.intermediate_size / tp)
            out += [(*g, dense) for g in self._mlp_gemms("", tokens, inter)]
        if moe:
            out.append(("router", tokens, self.num_experts, self.hidden_size, moe))
            if self.num_shared_experts:
                inter = math.ceil(self.shared_intermediate_size / tp)
                out += [(*g, moe) for g in self._mlp_gemms("shared.", tokens, inter)]
        return out

    def lm_head_gemm(self, tokens: int, tp: int = 1) -> Gemm:
        """Logits for `tokens` sampled positions; the vocabulary is split over tp ranks."""
        if tokens < 1:
            raise InfersimError(f"tokens must be >= 1, got {tokens}")
        self.check_tp(tp)
        return ("lm_head", tokens, math.ceil(self.vocab_size / tp), self.hidden_size)
