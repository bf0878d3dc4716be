"""What a partial calibration profile leaves to `auto`.

A profile fitted on some op classes only (a GEMM sweep, NCCL on two GPUs, bf16 alone)
holds the datasheet defaults for the rest. Applied as it is, it would quietly swap the
shipped profile `auto` gives that chip for the datasheet on everything it did not
measure, while the run line says "fitted on this GPU". So the parts it did not fit are
taken from the `auto` profile: whole op classes it has no rows for (their own fields, by
prefix), and within a class it fitted, the dtypes and GPU counts of auto's per-dtype or
per-group-size entries it lacks (an fp8 curve beside a bf16-only fit; a link fit over 8
GPUs beside one over 2). The fields no fit sets (launch overheads, the L2 bandwidth, the
attention floor) are the preset defaults in every profile, the shipped ones included.
"""

from __future__ import annotations

from hardware_models.efficiency import EfficiencyProfile

# Op class (of metadata.rows_used) -> the prefixes (or whole names) of the
# EfficiencyProfile fields its fit sets: the GEMM fit also sets the generic kernel floor
# (fit.generic_from_dtypes), MLA decode the 8-bit cache's extra time, device copies the
# memory bandwidth.
CLASS_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("gemm_", "kernel_floor_us"),
    "attention_prefill": ("attention_prefill_", "prefill_"),
    "attention_decode": ("attention_decode_", "decode_"),
    "moe": ("moe_",),
    "mla_prefill": ("mla_prefill_",),
    "mla_decode": ("mla_decode_", "mla_fp8_kv_us"),
    "collectives": ("collective_",),
    "memory_copy": ("memory_bandwidth",),
}
COLLECTIVE_ROWS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all"})


def covered_classes(rows_used: dict[str, int]) -> set[str]:
    """The CLASS_FIELDS classes a profile's metadata.rows_used says it fitted."""
    classes = {name for name, rows in rows_used.items() if rows > 0}
    return (classes - COLLECTIVE_ROWS) | ({"collectives"} if classes & COLLECTIVE_ROWS else set())


def class_fields(op_class: str) -> list[str]:
    return [f for f in EfficiencyProfile.model_fields if f.startswith(CLASS_FIELDS[op_class])]


def fill_from(
    profile: EfficiencyProfile,
    covered: set[str],
    auto: EfficiencyProfile,
    auto_covered: set[str],
) -> tuple[EfficiencyProfile, list[str]]:
    """`profile` with what it did not fit and `auto` did taken from `auto`, and those
    parts in words (`attention_prefill`, `gemm fp8`, `collectives over 8 GPUs`)."""
    update: dict[str, object] = {}
    taken: list[str] = []
    for op_class in CLASS_FIELDS:
        if op_class not in auto_covered:
            continue
        fields = class_fields(op_class)
        if op_class not in covered:
            update |= {f: getattr(auto, f) for f in fields}
            taken.append(op_class)
            continue
        # A dtype (GPU count) the profile fitted has an entry in some per-key field.
        tables = [f for f in fields if isinstance(getattr(profile, f), dict)]
        fitted = {key for f in tables for key in getattr(profile, f)}
        missing = {key for f in tables for key in getattr(auto, f)} - fitted
        for field in tables:
            theirs = {k: v for k, v in getattr(auto, field).items() if k in missing}
            if theirs:
                update[field] = {**theirs, **getattr(profile, field)}
        if missing:
            keys = ", ".join(str(k) for k in sorted(missing, key=str))
            over = f"over {keys} GPUs" if op_class == "collectives" else keys
            taken.append(f"{op_class} {over}")
    return profile.model_copy(update=update), taken
