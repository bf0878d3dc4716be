"""The micro-benchmarks: GEMMs, device copies, attention prefill and decode, one layer.

Each returns rows of the long table (measured_tables.COLUMNS), so harness output and the
public tables go through the same fit and validation code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

from hardware_models.attention import causal_pairs
from hardware_models.calibration.harness.plan import Plan
from hardware_models.calibration.harness.timing import median_seconds
from hardware_models.calibration.layer import LayerShape, layer_flops
from hardware_models.calibration.measured_tables import COLUMNS
from hardware_models.dtypes import parse_dtype

Progress = Callable[[str], None]


def make_row(gpu: str, op_class: str, torch_dtype: str, source: str, **fields: float) -> dict:
    """A long-table row: every COLUMN present, NaN where the op has no such dimension."""
    row: dict = {c: math.nan for c in COLUMNS}
    row.update(
        gpu=gpu,
        op_class=op_class,
        dtype=parse_dtype(torch_dtype.replace("float8_e4m3fn", "fp8")).value,
        kv_dtype=None,
        source=f"harness:{source}",
        source_dtype=torch_dtype,
    )
    row.update(fields)
    return row


class Bench:
    """Shared state of one harness run: torch, the device, the plan, the row label."""

    def __init__(self, torch: ModuleType, device: str, plan: Plan, gpu: str) -> None:
        self.torch, self.device, self.plan, self.gpu = torch, device, plan, gpu
        self.errors: dict[str, str] = {}  # part of a family that failed -> why
        self.attention_dtype = "bfloat16" if device == "cuda" else "float32"

    def time(self, fn: Callable[[], object], hide_launch: bool = True) -> float:
        plan = self.plan
        return median_seconds(self.torch, self.device, fn, plan.warmup, plan.repeats, hide_launch)

    def warm_up(self, calls: int = 300) -> None:
        """Raise the GPU from its idle clocks (a few hundred MHz) before the first timed
        shape, the smallest: ~0.5 s of large bf16 GEMMs on an H100."""
        if self.device != "cuda":
            return
        a = self.randn(8192, 8192, dtype="bfloat16")
        for _ in range(calls):
            a @ a
        self.torch.cuda.synchronize()

    def randn(self, *shape: int, dtype: str):
        t = self.torch
        return t.randn(*shape, device=self.device, dtype=getattr(t, dtype))

    # ------------------------------------------------------------------ GEMM
    def fp8_supported(self) -> bool:
        t = self.torch
        return (
            self.device == "cuda"
            and hasattr(t, "float8_e4m3fn")
            and t.cuda.get_device_capability() >= (8, 9)
        )

    def _gemm_fn(self, m: int, n: int, k: int, dtype: str) -> Callable[[], object]:
        t = self.torch
        if dtype == "float8_e4m3fn":
            a = self.randn(m, k, dtype="bfloat16").to(t.float8_e4m3fn)
            b = self.randn(n, k, dtype="bfloat16").to(t.float8_e4m3fn).t()  # column-major
            one = t.tensor(1.0, device=self.device)
            # Fast accumulation, as serving engines' fp8 kernels run (vLLM's CUTLASS ones).
            return lambda: t._scaled_mm(
                a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16, use_fast_accum=True
            )
        # B as a linear layer holds its weight: (n, k) row-major, used transposed.
        a, b = self.randn(m, k, dtype=dtype), self.randn(n, k, dtype=dtype).t()
        return lambda: a @ b

    def gemm(self, progress: Progress) -> list[dict]:
        dtypes = list(self.plan.gemm_dtypes)
        if self.fp8_supported():
            dtypes.append("float8_e4m3fn")
        else:
            progress("gemm: no fp8 (needs a CUDA GPU of compute capability 8.9 or newer)")
        rows: list[dict] = []
        for dtype in dtypes:
            # One dtype's failure (ROCm's fp8 spelling, out of memory at the largest
            # shape) keeps what was timed, of it and of the others, and is recorded.
            try:
                self._gemm_dtype(dtype, rows)
            except Exception as exc:
                self.errors[f"gemm {dtype}"] = f"{type(exc).__name__}: {exc}"
                progress(f"gemm {dtype}: failed ({self.errors[f'gemm {dtype}']}); going on")
            progress(f"gemm {dtype}: {sum(r['source_dtype'] == dtype for r in rows)} shapes")
        return rows

    def _gemm_dtype(self, dtype: str, rows: list[dict]) -> None:
        """Time every planned shape of `dtype`, appending each row as it is timed."""
        for m in self.plan.gemm_m:
            for n in self.plan.gemm_nk:
                for k in self.plan.gemm_nk:
                    if dtype == "float8_e4m3fn" and m % 16:
                        continue  # _scaled_mm needs every dimension a multiple of 16
                    secs = self.time(self._gemm_fn(m, n, k, dtype))
                    size = 2.0 * m * n * k
                    rows.append(
                        make_row(
                            self.gpu,
                            "gemm",
                            dtype,
                            "gemm",
                            m=m,
                            n=n,
                            k=k,
                            size=size,
                            measured_s=secs,
                        )
                    )

    # ------------------------------------------------------------------ copies
    def copy(self, progress: Progress) -> list[dict]:
        t = self.torch
        rows = []
        for nbytes in self.plan.copy_bytes:
            src = t.empty(nbytes, dtype=t.uint8, device=self.device).random_(0, 255)
            dst = t.empty_like(src)
            secs = self.time(lambda dst=dst, src=src: dst.copy_(src))
            rows.append(
                make_row(
                    self.gpu,
                    "memory_copy",
                    "int8",
                    "copy",
                    nbytes=nbytes,
                    size=nbytes,
                    measured_s=secs,
                )
            )
        progress(f"memory copy: {len(rows)} sizes")
        return rows

    # ------------------------------------------------------------------ attention
    def sdpa(self, q, k, v, causal: bool):
        """scaled_dot_product_attention with grouped KV heads, on any torch >= 2.2."""
        f = self.torch.nn.functional
        if q.shape[1] == k.shape[1]:
            return f.scaled_dot_product_attention(q, k, v, is_causal=causal)
        try:
            return f.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:  # torch < 2.5: expand the KV heads instead
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            return f.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def attention(self, progress: Progress) -> list[dict]:
        dtype, rows = self.attention_dtype, []
        for heads, kv_heads, dim in self.plan.attention_heads:
            shape = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": dim}
            common = {**shape, "kv_dtype": parse_dtype(dtype).value, "window": 0}
            for batch, seq in self.plan.prefill:
                q = self.randn(batch, heads, seq, dim, dtype=dtype)
                k, v = (self.randn(batch, kv_heads, seq, dim, dtype=dtype) for _ in "kv")
                secs = self.time(lambda q=q, k=k, v=v: self.sdpa(q, k, v, causal=True))
                pairs = batch * causal_pairs(seq, seq)
                rows.append(
                    make_row(
                        self.gpu,
                        "attention_prefill",
                        dtype,
                        "sdpa_prefill",
                        batch=batch,
                        q_len=seq,
                        kv_len=seq,
                        size=4.0 * heads * dim * pairs,
                        measured_s=secs,
                        **common,
                    )
                )
            for batch, ctx in self.plan.decode:
                q = self.randn(batch, heads, 1, dim, dtype=dtype)
                k, v = (self.randn(batch, kv_heads, ctx, dim, dtype=dtype) for _ in "kv")
                secs = self.time(lambda q=q, k=k, v=v: self.sdpa(q, k, v, causal=False))
                rows.append(
                    make_row(
                        self.gpu,
                        "attention_decode",
                        dtype,
                        "sdpa_decode",
                        batch=batch,
                        q_len=1,
                        kv_len=ctx,
                        size=4.0 * heads * dim * batch * ctx,
                        measured_s=secs,
                        **common,
                    )
                )
        progress(f"attention: {len(rows)} prefill and decode shapes")
        return rows

    # ------------------------------------------------------------------ one layer
    def layer(self, progress: Progress) -> list[dict]:
        shape, rows = self.plan.layer, []
        for (batch, ctx), q_len in (
            (self.plan.layer_prefill, self.plan.layer_prefill[1]),
            (self.plan.layer_decode, 1),
        ):
            forward = LlamaLayer(self, shape, batch, q_len, ctx)
            secs = self.time(forward, hide_launch=False)  # eager launches are modelled
            rows.append(
                make_row(
                    self.gpu,
                    "transformer_layer",
                    self.attention_dtype,
                    "llama_layer",
                    batch=batch,
                    q_len=q_len,
                    kv_len=ctx,
                    num_heads=shape.num_heads,
                    num_kv_heads=shape.num_kv_heads,
                    head_dim=shape.head_dim,
                    kv_dtype=parse_dtype(self.attention_dtype).value,
                    window=0,
                    m=batch * q_len,
                    n=shape.hidden,
                    k=shape.intermediate,
                    size=layer_flops(shape, batch, q_len, ctx),
                    measured_s=secs,
                )
            )
        progress("transformer layer: prefill and decode batches")
        return rows


class LlamaLayer:
    """One Llama-style decoder layer with random weights and a KV cache of `kv_len`
    tokens, of which the last `q_len` are written by this forward."""

    def __init__(self, bench: Bench, shape: LayerShape, batch: int, q_len: int, kv_len: int):
        t, dt = bench.torch, bench.attention_dtype
        h, kvh, d, hid = shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.hidden
        self.bench, self.shape, self.q_len, self.kv_len = bench, shape, q_len, kv_len
        self.x = bench.randn(batch, q_len, hid, dtype=dt)
        self.w_qkv = bench.randn(hid, (h + 2 * kvh) * d, dtype=dt) * hid**-0.5
        self.w_o = bench.randn(h * d, hid, dtype=dt) * (h * d) ** -0.5
        self.w_gate_up = bench.randn(hid, 2 * shape.intermediate, dtype=dt) * hid**-0.5
        self.w_down = bench.randn(shape.intermediate, hid, dtype=dt) * shape.intermediate**-0.5
        self.norm = t.ones(hid, device=bench.device, dtype=getattr(t, dt))
        self.k_cache = bench.randn(batch, kvh, kv_len, d, dtype=dt)
        self.v_cache = bench.randn(batch, kvh, kv_len, d, dtype=dt)
        pos = t.arange(kv_len - q_len, kv_len, device=bench.device, dtype=t.float32)
        inv = 1.0 / (500000.0 ** (t.arange(0, d, 2, device=bench.device) / d))
        angles = t.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)
        self.cos, self.sin = angles.cos().to(self.x.dtype), angles.sin().to(self.x.dtype)

    def _rms(self, x):
        t = self.bench.torch
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * t.rsqrt(var + 1e-5)).to(x.dtype) * self.norm

    def _rotary(self, x):
        half = x.shape[-1] // 2
        rotated = self.bench.torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def __call__(self):
        t, s = self.bench.torch, self.shape
        with t.inference_mode():
            b, q = self.x.shape[0], self.q_len
            h, kvh, d = s.num_heads, s.num_kv_heads, s.head_dim
            qkv = self._rms(self.x) @ self.w_qkv
            qh, kh, vh = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
            qh = self._rotary(qh.view(b, q, h, d).transpose(1, 2))
            kh = self._rotary(kh.view(b, q, kvh, d).transpose(1, 2))
            self.k_cache[:, :, self.kv_len - q :] = kh
            self.v_cache[:, :, self.kv_len - q :] = vh.view(b, q, kvh, d).transpose(1, 2)
            attn = self.bench.sdpa(qh, self.k_cache, self.v_cache, causal=q > 1)
            x = self.x + attn.transpose(1, 2).reshape(b, q, h * d) @ self.w_o
            gate, up = (self._rms(x) @ self.w_gate_up).chunk(2, dim=-1)
            return x + (t.nn.functional.silu(gate) * up) @ self.w_down
