"""What a transformer is made of, in the numbers that decide its memory and FLOPs.

Parameter counts are derived from the shapes (not typed in) so they can be checked against
the publisher's figure, and the same shapes give the GEMMs the step cost model prices.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_models.dtypes import Dtype, bytes_per_element
from hardware_models.errors import InfersimError

Gemm = tuple[str, int, int, int]
"""(name, m, n, k): an (m x k) @ (k x n) matrix multiply."""


class ModelArchitecture(BaseModel):
    """A decoder-only transformer (dense or MoE). Validated strictly: unknown fields fail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="catalog id")
    display_name: str
    family: str = Field(description="HF model_type: llama, mistral, mixtral, qwen2, ...")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0, description="MLP width; per expert for MoE")
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0, description="= heads for MHA, < heads for GQA, 1 for MQA")
    head_dim: int = Field(gt=0, description="defaults to hidden_size // num_attention_heads")
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = False
    gated_mlp: bool = Field(default=True, description="SwiGLU: gate, up and down matrices")
    num_experts: int = Field(default=1, ge=1, description="1 = dense MLP")
    experts_per_token: int = Field(default=1, ge=1)
    sliding_window: int | None = Field(default=None, gt=0)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    attention_bias: bool = Field(default=False, description="bias on the Q, K, V projections")
    published_params_b: float | None = Field(
        default=None, gt=0, description="the publisher's total parameter count, billions"
    )
    source: str = Field(min_length=1)

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
        return self

    # ---- shapes ----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (all heads)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection output; smaller than q_dim under GQA/MQA."""
        return self.num_kv_heads * self.head_dim

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    # ---- parameter counts ------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        """Q, K, V, O projections plus the QKV bias where the model has one."""
        weights = 2 * self.hidden_size * self.q_dim + 2 * self.hidden_size * self.kv_dim
        bias = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        return weights + bias

    @property
    def expert_params(self) -> int:
        """One MLP (one expert for MoE): gate, up, down (or up, down when not gated)."""
        return self._mlp_matrices * self.hidden_size * self.intermediate_size

    @property
    def mlp_params_per_layer(self) -> int:
        """All experts: what must sit in memory."""
        return self.num_experts * self.expert_params

    @property
    def active_mlp_params_per_layer(self) -> int:
        """Experts one token passes through: what it costs in FLOPs."""
        return self.experts_per_token * self.expert_params

    @property
    def router_params_per_layer(self) -> int:
        """The MoE gate (hidden -> num_experts logits); zero for dense models."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def _norm_params(self) -> int:
        return self.hidden_size * (1 if self.norm == "rmsnorm" else 2)

    @property
    def norm_params_per_layer(self) -> int:
        """Pre-attention and pre-MLP norms (LayerNorm also has a bias)."""
        return 2 * self._norm_params

    @property
    def final_norm_params(self) -> int:
        return self._norm_params

    @property
    def layer_params(self) -> int:
        """Everything in one transformer block."""
        return (
            self.attention_params_per_layer
            + self.mlp_params_per_layer
            + self.router_params_per_layer
            + self.norm_params_per_layer
        )

    @property
    def linear_params_per_layer(self) -> int:
        """Projection and expert weight matrices: the part weight quantisation applies to."""
        return (
            2 * self.hidden_size * self.q_dim
            + 2 * self.hidden_size * self.kv_dim
            + self.mlp_params_per_layer
        )

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
            self.num_layers * self.layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

    def active_param_count(self) -> int:
        """Parameters one token touches (MoE: experts_per_token experts), e.g. 12.9B for Mixtral."""
        inactive = self.mlp_params_per_layer - self.active_mlp_params_per_layer
        return self.param_count() - self.num_layers * inactive

    def kv_bytes_per_token(self, kv_dtype: str | Dtype = Dtype.BF16) -> float:
        """K and V of one token over all layers; what the KV cache grows by per token."""
        return 2 * self.num_layers * self.kv_dim * bytes_per_element(kv_dtype)

    def matmul_flops_per_token(self, include_lm_head: bool = True) -> int:
        """2 x the active matmul weights (no attention-score FLOPs, no embedding lookup).

        In inference the LM head runs only for sampled tokens, so prefill costing passes
        include_lm_head=False for all but the last position.
        """
        per_layer = (
            2 * self.hidden_size * self.q_dim
            + 2 * self.hidden_size * self.kv_dim
            + self.active_mlp_params_per_layer
            + self.router_params_per_layer
        )
        head = self.vocab_size * self.hidden_size if include_lm_head else 0
        return 2 * (self.num_layers * per_layer + head)

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
        if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
            raise InfersimError(
                f"{self.name}: num_kv_heads ({kv}) and tp={tp} must divide one another "
                "(KV heads are split when tp <= kv heads, replicated when tp > kv heads)"
            )

    def kv_heads_per_shard(self, tp: int) -> int:
        """KV heads held by one TP rank; replicated (1 per rank) when tp > num_kv_heads."""
        self.check_tp(tp)
        return max(1, self.num_kv_heads // tp)

    def layer_gemms(self, tokens: int, tp: int = 1) -> list[Gemm]:
        """GEMMs of one layer for `tokens` tokens on one TP rank, as (name, m, n, k).

        Column-parallel projections (qkv_proj, gate_up/up) split n over tp; row-parallel
        ones (o_proj, down) split k. For MoE the router GEMM is replicated and each expert
        gets its own gate_up/down with ceil(tokens * experts_per_token / num_experts)
        tokens: this assumes perfectly balanced routing, the best case for latency.
        """
        if tokens < 1:
            raise InfersimError(f"tokens must be >= 1, got {tokens}")
        kv_per_rank = self.kv_heads_per_shard(tp)
        h = self.hidden_size
        q_per_rank = self.q_dim // tp
        gemms: list[Gemm] = [
            ("qkv_proj", tokens, q_per_rank + 2 * kv_per_rank * self.head_dim, h),
            ("o_proj", tokens, h, q_per_rank),
        ]
        inter = math.ceil(self.intermediate_size / tp)
        up_name, up_n = ("gate_up", 2 * inter) if self.gated_mlp else ("up", inter)
        if not self.is_moe:
            return [*gemms, (up_name, tokens, up_n, h), ("down", tokens, h, inter)]
        routed = math.ceil(tokens * self.experts_per_token / self.num_experts)
        gemms.append(("router", tokens, self.num_experts, h))
        for e in range(self.num_experts):
            gemms.append((f"expert{e}.{up_name}", routed, up_n, h))
            gemms.append((f"expert{e}.down", routed, h, inter))
        return gemms

    def lm_head_gemm(self, tokens: int, tp: int = 1) -> Gemm:
        """Logits for `tokens` sampled positions; the vocabulary is split over tp ranks."""
        if tokens < 1:
            raise InfersimError(f"tokens must be >= 1, got {tokens}")
        self.check_tp(tp)
        return ("lm_head", tokens, math.ceil(self.vocab_size / tp), self.hidden_size)
