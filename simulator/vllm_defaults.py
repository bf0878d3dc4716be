"""What vLLM (the V1 engine, `vllm serve`) sets when a configuration is silent.

A measured run records what its user passed and sometimes what the engine resolved; the
rest is vLLM's default for that version and, for the batch limits, for that GPU. A
scenario that leaves serving.max_num_seqs or max_num_batched_tokens unset gets the same
defaults, for EMULATED_VLLM_VERSION (scenario.ServingSection.with_vllm_defaults). Each
entry below names where it comes from in vLLM, so a replay or a run can say what it
assumed.
Sources (vLLM repository and release notes):

- V1 is the default engine from 0.8.0; it always chunks prefills and turns prefix
  caching on unless told otherwise (`EngineArgs._set_default_args_v1`). Later releases
  take the default from the model (`EngineArgs._set_default_chunked_prefill_and_prefix_
  caching_args`: `ModelConfig.is_prefix_caching_supported`): on for a decoder-only
  generative model, off for hybrid (Mamba + attention) and attention-free models,
  encoder-decoder models and pooling models that pool by mean, CLS or step; 0.26 keeps
  it opt-in for hybrid models that support it (`and not model_config.is_hybrid`).
  infersim models decoder-only generative transformers (sliding-window ones included,
  which vLLM counts as decoders), so V1's default is on for every model it runs. vLLM
  v0 (before 0.8.0) defaulted it off (`EngineArgs.enable_prefix_caching = False`; 0.7's
  `__post_init__` sets it to `VLLM_USE_V1`).
- Batch limits for `vllm serve` (UsageContext.OPENAI_API_SERVER), by the GPU as vLLM sees
  it: a "big" GPU gets max_num_batched_tokens 8192 and max_num_seqs 1024, any other 2048
  and 256. Which GPUs are big: H100/H200 by device name (PR #12369, before V1 became the
  default); GPUs of at least 70 GiB from 0.8.5 (PR #17073, merged 2025-04-23); those but
  the A100 from 0.9.0 (PR #17885, merged 2025-05-09, `EngineArgs.get_batch_defaults`).
  Before 0.8.4 max_num_seqs was 1024 on every GPU (PR #16158 put it back to 256).
  The offline `LLM` class (UsageContext.LLM_CLASS) gets the same sequences but 16384
  tokens on a big GPU and 8192 on others; infersim emulates the server, as runs serve.
  Checked up to 0.28; PR #51726 (2026-08) adds a 16384-token tier for GPUs of 160 GiB
  or more in a release after it, so a later version is flagged as unchecked.
- With chunked prefill off, max_num_batched_tokens is at least max_model_len, so a
  whole prompt fits one step (`EngineArgs`: max(max_model_len, the default above)).
- The two limits bound each other where unset (batch_limits). An unset max_num_seqs is
  at most max_num_batched_tokens, set or defaulted (`min(max_num_seqs,
  max_num_batched_tokens)` under `if orig_max_num_seqs is None` in
  `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`, 0.12 to 0.19 and main),
  so `--max-num-batched-tokens 512` alone starts with 512 sequences where the default
  would be 1024. The 0.8/0.9 sources set the default sequences with no such bound
  (`_set_default_args_v1`: `self.max_num_seqs = default_max_num_seqs`), and
  SchedulerConfig then refused a budget below them; a later `_set_default_args_v1`
  (the one deprecating disable_log_requests for 0.12) has the bound; the release that
  added it was not found, so it is taken from 0.10.0. An unset max_num_batched_tokens
  is at most max_num_seqs * max_model_len (vllm PR #17853, 2025-05, for Whisper; applied
  to `vllm serve`'s default since PR #28665 moved the defaults into that function,
  2025-11, so from 0.12.0).
- block_size 16 on CUDA; gpu_memory_utilization 0.9 (`CacheConfig`), every version.
- Async scheduling: an opt-in flag from 0.10.0 (PR #19970), on by default from 0.14.0
  (release notes: "Async scheduling is now enabled by default", PR #27614), except with
  pipeline parallelism.
- CUDA graphs: on unless `enforce_eager` (`ModelConfig.enforce_eager = False`).
- VLLM_ALLREDUCE_USE_SYMM_MEM (torch symmetric-memory all-reduce, `symm_mem_default`):
  the backend arrived in 0.10.2, off (PR #20759; #24111 turned it on and #24696 off again
  before that release); #25070 turned it on for 0.11.0 (issue #26525 reports that
  release's default); #26925 (2025-10-15) turned it off again before 0.11.1. It is on
  again in 0.18.0 (issue #38550 reports the default 1) and on vLLM's main branch; the
  release between that turned it back on was not found, so 0.12 to 0.17 are a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hardware_models.errors import InfersimError

FIRST_V1 = (0, 8, 0)
LAST_CHECKED = (0, 28, 0)
EMULATED_VLLM_VERSION = (0, 19, 0)
"""The vLLM release a scenario's unset engine settings default as: the one whose scheduler
infersim models (scheduler_reserve_full_isl, engine/scheduler.py) and whose measured runs
(../shared/data/e2e) the shipped profiles are checked against."""
# V1's default for the models infersim describes (the module doc names those it is off for)
PREFIX_CACHING_V1 = (
    "the V1 engine's, on for a decoder-only model (ModelConfig.is_prefix_caching_supported)"
)
PREFIX_CACHING_V0 = "vLLM v0's default (EngineArgs.enable_prefix_caching = False before V1)"
_BIG_GPU_GIB = 70  # vLLM's threshold for its larger batch defaults (from 0.8.5)
_SEQS_BOUND_BY_TOKENS = (0, 10, 0)  # unset max_num_seqs <= max_num_batched_tokens (module doc)
_TOKENS_BOUND_BY_SEQS = (0, 12, 0)  # unset budget <= max_num_seqs * max_model_len


@dataclass(frozen=True)
class Default:
    """A value vLLM would have used, and why."""

    value: object
    reason: str

    def line(self, setting: str) -> str:
        """`setting` = value (why): how a run's header and a replay's notes state it."""
        return f"{setting} = {self.value} ({self.reason})"


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.19.0', 'v0.8.5.post1', '0.10.1rc2+cu128' -> (major, minor, patch)."""
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not found:
        raise InfersimError(f"vllm_version {text!r} is not a version number (expected e.g. 0.19.0)")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def version_text(version: tuple[int, int, int]) -> str:
    """(0, 19, 0) -> "0.19.0", as messages name a release."""
    return ".".join(map(str, version))


def _big_gpu(version: tuple[int, int, int], name: str, gib: float) -> tuple[bool, str]:
    """Whether vLLM `version` gives this GPU its larger batch defaults, and why."""
    if version < (0, 8, 5):
        big = "h100" in name or "h200" in name
        return big, "an H100/H200" if big else "not an H100/H200"
    # vLLM reads it from torch.cuda, which on AMD GPUs is ROCm's HIP runtime.
    reported = f"{gib:.2f} GiB as {'ROCm' if 'amd' in name.lower() else 'CUDA'} reports it"
    if gib < _BIG_GPU_GIB:
        return False, f"{reported}, under {_BIG_GPU_GIB}"
    if version >= (0, 9, 0) and "a100" in name:
        return False, "an A100, left out from 0.9.0"
    return True, f"{reported}, at least {_BIG_GPU_GIB}"


# VLLM_ALLREDUCE_USE_SYMM_MEM's default by release (see the module doc): (first version,
# value, why; the why says where the sources do not pin the release).
_SYMM_MEM_DEFAULTS = (
    ((0, 0, 0), False, "no symmetric-memory all-reduce before 0.10.2"),
    ((0, 10, 2), False, "off in 0.10.2 (vllm-project/vllm#24696)"),
    ((0, 11, 0), True, "on in 0.11.0 (vllm-project/vllm#25070, #26525)"),
    ((0, 11, 1), False, "off from 0.11.1 (vllm-project/vllm#26925)"),
    (
        (0, 12, 0),
        False,
        "off from 0.11.1 (vllm-project/vllm#26925) and on again by 0.18.0 "
        "(#38550): uncertain which release in between turned it back on; assumed still off",
    ),
    ((0, 18, 0), True, "on again by 0.18.0 (vllm-project/vllm#38550)"),
)


def symm_mem_default(version: tuple[int, int, int]) -> Default:
    """VLLM_ALLREDUCE_USE_SYMM_MEM's default in vLLM `version` (which no run records), and
    why."""
    _, value, why = next(row for row in reversed(_SYMM_MEM_DEFAULTS) if version >= row[0])
    return Default(value, f"vLLM {version_text(version)}: {why}")


def vllm_default(
    field: str,
    version: tuple[int, int, int],
    gpu_name: str,
    gpu_memory_gib: float,
    *,
    chunked_prefill: bool = True,
    max_model_len: int = 0,
) -> Default:
    """vLLM's default for `field` in `version` on the GPU named `gpu_name` (as vLLM sees
    it: the device name) with `gpu_memory_gib` of memory as CUDA reports it (what
    vLLM's rule reads, not the datasheet figure); max_num_batched_tokens also depends on
    chunked prefill and max_model_len. Versions before the V1 engine (0.8.0)
    are not tabled: their defaults depended on max_model_len and the V0 scheduler."""
    if version < FIRST_V1:
        raise InfersimError(
            f"{field}: not recorded in the run, and vLLM {version_text(version)} predates the V1 "
            "engine (0.8.0) whose defaults infersim knows; give it with --set"
        )
    where = f"vLLM {version_text(version)} default"
    if version > LAST_CHECKED:
        where += f" (table checked up to {version_text(LAST_CHECKED)}: a later vLLM may differ)"
    big, big_why = _big_gpu(version, gpu_name.lower(), gpu_memory_gib)
    if field == "max_num_batched_tokens":
        tokens = 8192 if big else 2048
        why = f"{where} for `vllm serve` on this GPU ({big_why})"
        if not chunked_prefill and max_model_len > tokens:  # a whole prompt fits one step
            return Default(
                max_model_len,
                f"{where}: max_model_len as chunked prefill is off, over the {tokens} "
                f"for `vllm serve` on this GPU ({big_why})",
            )
        return Default(tokens, why)
    if field == "max_num_seqs":
        if version < (0, 8, 4):
            return Default(1024, f"{where} for `vllm serve`")
        return Default(1024 if big else 256, f"{where} for `vllm serve` on this GPU ({big_why})")
    if field == "async_scheduling":
        return Default(version >= (0, 14, 0), f"{where}: on by default from 0.14.0")
    fixed = {
        "enable_chunked_prefill": (True, "the V1 engine always chunks prefills"),
        "enable_prefix_caching": (True, PREFIX_CACHING_V1),
        "block_size": (16, "the default on CUDA"),
        "gpu_memory_utilization": (0.9, ""),
        "enforce_eager": (False, "CUDA graphs on"),
        "tensor_parallel_size": (1, ""),
        "pipeline_parallel_size": (1, ""),
        "data_parallel_size": (1, ""),
        "enable_expert_parallel": (False, ""),
    }
    if field not in fixed:
        raise KeyError(field)
    value, why = fixed[field]
    return Default(value, f"{where}: {why}" if why else where)


def batch_limits(
    version: tuple[int, int, int],
    gpu_name: str,
    gpu_memory_gib: float,
    *,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    chunked_prefill: bool,
    max_model_len: int,
) -> dict[str, Default]:
    """vLLM `version`'s values for whichever of the two batch limits is None, resolved as
    EngineArgs does: each GPU default (vllm_default), then an unset budget bounded by
    max_num_seqs * max_model_len and unset sequences by the budget (module doc), so a
    limit that is given bounds the other's default."""
    defaults = {
        name: vllm_default(
            name,
            version,
            gpu_name,
            gpu_memory_gib,
            chunked_prefill=chunked_prefill,
            max_model_len=max_model_len,
        )
        for name, given in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        )
        if given is None
    }
    seqs = defaults["max_num_seqs"].value if max_num_seqs is None else max_num_seqs
    tokens = defaults.get("max_num_batched_tokens")
    if tokens is not None and version >= _TOKENS_BOUND_BY_SEQS:
        bound = seqs * max_model_len
        if bound < tokens.value:
            defaults["max_num_batched_tokens"] = Default(
                bound,
                f"{tokens.reason}, lowered to max_num_seqs * max_model_len = "
                f"{seqs} * {max_model_len} (EngineArgs bounds a default budget so)",
            )
    budget = defaults["max_num_batched_tokens"].value if tokens else max_num_batched_tokens
    sequences = defaults.get("max_num_seqs")
    if sequences is not None and version >= _SEQS_BOUND_BY_TOKENS and budget < sequences.value:
        given = "the max_num_batched_tokens given" if tokens is None else "its default"
        defaults["max_num_seqs"] = Default(
            budget,
            f"{sequences.reason}, lowered to max_num_batched_tokens = {budget} ({given}: "
            "vLLM bounds default sequences by the token budget)",
        )
    return defaults
