"""One operator to price, described by plain fields: the shared shape of the `roofline`
command's flags and of the rows of its `--input` CSV."""

from __future__ import annotations

import math
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import (
    attention_decode_cost,
    uniform_prefill_cost,
)
from hardware_models.collectives import collective_cost, group_link
from hardware_models.dtypes import Dtype, parse_dtype
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost
from hardware_models.node import NodeSpec
from hardware_models.op_cost import OpCost
from hardware_models.pointwise import embedding_cost
from hardware_models.yaml_io import validate_model

OpName = Literal[
    "gemm",
    "attention_prefill",
    "attention_decode",
    "embedding",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
]
# Block-scaled GEMM formats (hardware_models.block_scaling): a GEMM's dtype only.
ScaledGemmDtype = Literal["fp8_block", "nvfp4", "mxfp4"]
COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
REQUIRED: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "attention_prefill": ("batch", "q_len", "heads", "head_dim"),
    "attention_decode": ("batch", "context", "heads", "head_dim"),
    "embedding": ("tokens", "hidden"),
    **{name: ("bytes", "gpus") for name in COLLECTIVES},
}


class OperatorRequest(BaseModel):
    """Fields are named after the CLI flags (with '-' as '_')."""

    model_config = ConfigDict(extra="forbid")

    op: OpName = "gemm"
    dtype: Dtype | ScaledGemmDtype = Field(
        default=Dtype.BF16, description="a dtype; for gemm also fp8_block, nvfp4 or mxfp4"
    )
    kv_dtype: Dtype | None = None
    m: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    k: int | None = Field(default=None, ge=1)
    batch: int | None = Field(default=None, ge=1)
    q_len: int | None = Field(default=None, ge=1, description="new tokens per sequence")
    kv_len: int | None = Field(default=None, ge=1, description="keys per sequence (default q_len)")
    context: int | None = Field(default=None, ge=1, description="decode: tokens already cached")
    heads: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1, description="default: heads (MHA)")
    head_dim: int | None = Field(default=None, ge=1)
    window: int | None = Field(default=None, ge=1, description="sliding window, tokens")
    tokens: int | None = Field(default=None, ge=1)
    hidden: int | None = Field(default=None, ge=1)
    bytes: float | None = Field(default=None, ge=0, description="collective buffer size")
    gpus: int | None = Field(default=None, ge=1)

    @field_validator("dtype", mode="before")
    @classmethod
    def _one_line_dtype_error(cls, value: object) -> object:
        text, scaled = str(value).strip().lower(), ScaledGemmDtype.__args__
        if text in scaled:
            return text
        try:
            return parse_dtype(text)
        except InfersimError as exc:
            raise ValueError(f"{exc}; for gemm also {', '.join(scaled)}") from None

    @model_validator(mode="after")
    def _required_fields(self) -> OperatorRequest:
        missing = [f for f in REQUIRED[self.op] if getattr(self, f) is None]
        if missing:
            hint = (
                " (the tokens already cached per sequence: context, not kv_len)"
                if "context" in missing and self.kv_len is not None
                else ""
            )
            raise ValueError(f"op {self.op} needs {', '.join(missing)}{hint}")
        if self.op != "gemm" and self.dtype not in tuple(Dtype):
            raise ValueError(
                f"dtype {self.dtype} is a block-scaled GEMM format; op {self.op} "
                f"takes {', '.join(d.value for d in Dtype)}"
            )
        if self.kv_len is not None and self.q_len is not None and self.kv_len < self.q_len:
            raise ValueError(f"kv_len ({self.kv_len}) must be >= q_len ({self.q_len})")
        return self

    def price(self, gpu: AcceleratorSpec, node: NodeSpec | None = None) -> OpCost:
        kv_dtype = self.kv_dtype or self.dtype
        kv_heads = self.kv_heads or self.heads
        if self.op == "gemm":
            return gemm_cost(gpu, self.m, self.n, self.k, self.dtype)
        if self.op == "attention_prefill":
            kv_len = self.kv_len or self.q_len
            return uniform_prefill_cost(
                gpu,
                batch=self.batch,
                q_len=self.q_len,
                kv_len=kv_len,
                window=self.window,
                num_heads=self.heads,
                num_kv_heads=kv_heads,
                head_dim=self.head_dim,
                dtype=self.dtype,
                kv_dtype=kv_dtype,
            )
        if self.op == "attention_decode":
            seen = min(self.context, self.window) if self.window else self.context
            return attention_decode_cost(
                gpu,
                num_seqs=self.batch,
                context_tokens=self.batch * seen,
                num_heads=self.heads,
                num_kv_heads=kv_heads,
                head_dim=self.head_dim,
                dtype=self.dtype,
                kv_dtype=kv_dtype,
            )
        if self.op == "embedding":
            return embedding_cost(gpu, self.tokens, self.hidden, self.dtype)
        return self._price_collective(gpu, node)

    def _price_collective(self, gpu: AcceleratorSpec, node: NodeSpec | None) -> OpCost:
        if node is None:
            raise InfersimError(f"op {self.op} needs a node (--node) to know the link")
        # The link the engine's StepCost._link takes for a group of this size.
        link = group_link(node, gpu, self.gpus)
        if link is None:
            raise InfersimError(
                f"node {node.name} has no link for {self.gpus} GPUs "
                f"({node.gpus_per_node} per node, inter-node link: "
                f"{'none' if node.inter_node_link is None else node.inter_node_link.kind})"
            )
        return collective_cost(self.op, self.bytes, self.gpus, link)


def parse_request(fields: dict, source: str) -> OperatorRequest:
    """Drop empty CSV cells, then validate with errors naming `source`."""
    clean = {
        k: v
        for k, v in fields.items()
        if v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""
    }
    return validate_model(OperatorRequest, clean, source)


def price_rows(
    rows: pd.DataFrame, gpu: AcceleratorSpec, node: NodeSpec | None, source: str
) -> list[OpCost]:
    """Price each row of a CSV; errors name the line (header = line 1)."""
    costs = []
    for i, record in enumerate(rows.to_dict(orient="records")):
        request = parse_request(record, f"{source} line {i + 2}")
        try:
            costs.append(request.price(gpu, node))
        except InfersimError as exc:
            raise InfersimError(f"{source} line {i + 2}: {exc}") from None
    return costs
