"""What one GPU draws while a step runs: a physics model in four parts, capped at the board
power limit.

    power = idle_w + busy_w + tensor_w x (FLOP/s / peak FLOP/s) + memory_w x (bytes/s / peak)

capped at tdp_w. `idle_w` is drawn whether or not a step runs (a model loaded, the CUDA
context holding its clocks); `busy_w` while any kernel runs, whatever it computes (clocks
at boost, every SM powered: leakage at the boost voltage and the clock tree); the tensor
part is energy per FLOP x the FLOP rate, the memory part energy per bit x the DRAM bit
rate. A mixed step (attention reading the KV cache while GEMMs run) pays both parts: the
energy of a FLOP and of a byte add up whichever of them bounds the step's time.

Coefficients (the GPU preset's `power` block may set each; otherwise):

- tensor_pj_per_flop: tdp_w / the dense 16-bit tensor peak. A GPU's rated peak at its
  power limit is what its designers budgeted the tensor datapath for; lower precisions do
  proportionally more FLOPs per clock on the same datapath, so a FLOP of one costs the
  16-bit energy x (16-bit peak / its peak) and `tensor_w` (the draw at any dtype's peak)
  is the same for every dtype. The sum exceeds tdp_w at full rate, as real parts do: an
  H100 running dense GEMMs near its peak holds its 700 W cap (Splitwise, ISCA'24).
- dram_pj_per_bit: by memory kind (DRAM_PJ_PER_BIT), the device's energy per bit moved.
- busy_w: idle_w (BUSY_FROM_IDLE): see the constant.

When the cap binds the model caps the power and keeps the step's time: step times come
from kernel timings measured on power-limited GPUs (the calibration tables), so the
throttling is already in them; slowing the step again would count it twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype
from hardware_models.errors import InfersimError

# Device energy per bit read or written, pJ, by memory kind (upper case). Micron's
# "Ultra-Bandwidth Solutions" comparison (average device power): GDDR6 7.5, GDDR6X 7.25,
# HBM2E 6.0. HBM2: the same 6.0 (O'Connor et al., MICRO'17, put HBM2's array and I/O
# alone at 3.9; Micron's figure is the whole device, as the others here are). HBM3 and
# HBM3e: no vendor publishes a figure; HBM2E's scaled by the square of the JEDEC core
# supply (1.2 V in HBM2E, 1.1 V in HBM3/HBM3e): 6.0 x (1.1/1.2)^2 = 5.0. GDDR7: Micron's
# GDDR7 brief claims over 50% better power efficiency than GDDR6: 7.5 / 1.5 = 5.0.
DRAM_PJ_PER_BIT = {
    "HBM2": 6.0,
    "HBM2E": 6.0,
    "HBM3": 5.0,
    "HBM3E": 5.0,
    "GDDR6": 7.5,
    "GDDR6X": 7.25,
    "GDDR7": 5.0,
}
# busy_w when the preset gives none, as a multiple of idle_w: running kernels raises the
# clocks from the loaded-idle state to boost, which roughly doubles the static and clock
# power. Measured bounds: the CUDA context alone lifts bare idle by 26-66 W (arXiv
# 2605.23918, H100/A100/L40S); an A100 held at its clocks at 0% utilisation drew 147 W
# against ~55 W loaded idle (+92 W, Bains 2026). idle_w again lies between them.
BUSY_FROM_IDLE = 1.0


@dataclass(frozen=True, slots=True)
class PowerModel:
    """One GPU's power coefficients, W: what it draws idle, busy, and at full tensor
    rate and full DRAM bandwidth on top (see the module doc)."""

    idle_w: float
    busy_w: float
    tensor_w: float
    memory_w: float
    tdp_w: float
    # What was not in the preset and was defaulted, for the run to say (empty: nothing).
    note: str = ""

    @property
    def headroom_w(self) -> float:
        """The most a step can add to idle: the cap."""
        return self.tdp_w - self.idle_w


def _sixteen_bit_peak(gpu: AcceleratorSpec) -> float:
    """The dense 16-bit tensor peak (BF16 where the GPU has it, else FP16), FLOP/s."""
    rates = gpu.tensor_flops_per_core_per_clock
    dtype = Dtype.BF16 if Dtype.BF16 in rates else Dtype.FP16
    if dtype not in rates:
        raise InfersimError(
            f"{gpu.name}: power.tensor_pj_per_flop is needed (no BF16 or FP16 tensor rate "
            "to derive it from as tdp_w / peak)"
        )
    return gpu.peak_flops(dtype)


def power_model(gpu: AcceleratorSpec) -> PowerModel:
    """The preset's coefficients, with the documented defaults for those it leaves out."""
    spec = gpu.power
    peak = _sixteen_bit_peak(gpu)
    pj_per_flop = spec.tensor_pj_per_flop or spec.tdp_w / peak * 1e12
    pj_per_bit = spec.dram_pj_per_bit
    note = ""
    if pj_per_bit is None:
        kind = gpu.memory.kind.strip().upper()
        if kind not in DRAM_PJ_PER_BIT:
            raise InfersimError(
                f"{gpu.name}: power.dram_pj_per_bit is not set and memory.kind {gpu.memory.kind!r} "
                f"has no default; set it, or use a kind with one: {', '.join(DRAM_PJ_PER_BIT)}"
            )
        pj_per_bit = DRAM_PJ_PER_BIT[kind]
        note = (
            f"{gpu.name}: power.dram_pj_per_bit not in the preset; {pj_per_bit:g} pJ/bit, "
            f"the {kind} default (hardware_models.power.DRAM_PJ_PER_BIT)"
        )
    busy = spec.idle_w * BUSY_FROM_IDLE if spec.busy_w is None else spec.busy_w
    return PowerModel(
        idle_w=spec.idle_w,
        busy_w=min(busy, spec.tdp_w - spec.idle_w),
        tensor_w=pj_per_flop * 1e-12 * peak,
        memory_w=pj_per_bit * 1e-12 * 8 * gpu.memory_bandwidth,
        tdp_w=spec.tdp_w,
        note=note,
    )
