"""Turn a measured run into the scenario that replays it: the GPU, model and engine
settings the run recorded, vLLM's defaults for its version where it recorded nothing
(each one said), and the run's own arrivals and lengths as a trace."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from hardware_models.device_names import preset_for_device
from hardware_models.errors import InfersimError
from hardware_models.presets import list_calibrations, load_gpu
from simulator.architecture import ModelArchitecture
from simulator.build import BuiltScenario, build_scenario
from simulator.memory_planner import MaxModelLenRefused
from simulator.model_catalog import CATALOG_DIR, list_models, load_model
from simulator.replay.measured import MeasuredRun
from simulator.scenario import BATCH_LIMITS, Scenario
from simulator.vllm_defaults import (
    batch_limits,
    parse_version,
    symm_mem_default,
    version_text,
    vllm_default,
)

NO_CALIBRATION = "none"

# where vLLM's resolved configuration keeps each engine setting
_RESOLVED = {
    "tensor_parallel_size": "parallel_config",
    "pipeline_parallel_size": "parallel_config",
    "data_parallel_size": "parallel_config",
    "enable_expert_parallel": "parallel_config",
    "disable_custom_all_reduce": "parallel_config",
    "max_num_seqs": "scheduler_config",
    "max_num_batched_tokens": "scheduler_config",
    "enable_chunked_prefill": "scheduler_config",
    "async_scheduling": "scheduler_config",
    "block_size": "cache_config",
    "gpu_memory_utilization": "cache_config",
    "enable_prefix_caching": "cache_config",
    "num_gpu_blocks": "cache_config",
    "max_model_len": "model_config",
    "enforce_eager": "model_config",
    "dtype": "model_config",
    "quantization": "model_config",
    "kv_cache_dtype": "cache_config",
}
_RESOLVED_NAME = {"kv_cache_dtype": "cache_dtype"}


@dataclass(frozen=True)
class ReplayOptions:
    """What the command line may set instead of the run: None means "from the run"."""

    model: str | None = None
    gpu: str | None = None
    node: str | None = None
    calibration: str | None = None
    vllm_version: str | None = None
    overrides: tuple[str, ...] = ()


class _Settings:
    """The run's engine settings, looked up where vLLM runs record them: what the engine
    resolved first (the resolved configuration, then the KV-cache summary), then the
    arguments it was given, which it may have changed."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.places: list[tuple[str, dict[str, Any]]] = []
        resolved = meta.get("resolved_config")
        if resolved is not None and not isinstance(resolved, dict):
            raise InfersimError("meta.json: 'resolved_config' must be an object")
        for section in sorted(set(_RESOLVED.values())):
            self._add(resolved or {}, section, f"resolved_config.{section}")
        for name in ("kv_cache", "engine_kwargs"):
            self._add(meta, name, name)

    def _add(self, parent: dict[str, Any], name: str, shown: str) -> None:
        value = parent.get(name)
        if value is None:
            return
        if not isinstance(value, dict):
            raise InfersimError(f"meta.json: {shown!r} must be an object, got {value!r}")
        self.places.append((shown, value))

    def place(self, shown: str) -> dict[str, Any]:
        """The settings recorded at `shown` (empty where the run has none)."""
        return next((values for name, values in self.places if name == shown), {})

    def get(self, field: str) -> tuple[Any, str] | None:
        """(value, where) of the first place recording `field` (not as null)."""
        return next(iter(self.all(field)), None)

    def all(self, field: str) -> list[tuple[Any, str]]:
        """(value, where) of every place recording `field`, in lookup order."""
        found = []
        for shown, values in self.places:
            name = field
            if shown.startswith("resolved_config."):
                if _RESOLVED.get(field) != shown.split(".", 1)[1]:
                    continue
                name = _RESOLVED_NAME.get(field, field)
            if values.get(name) is not None:
                found.append((values[name], f"{shown}.{name}"))
        return found


def gpu_preset_for(device_name: str) -> str | None:
    """The GPU preset for torch's device name, None where no preset is that part."""
    return preset_for_device(device_name)


# fine-tunes keep their base model's shapes: ...-Instruct is priced as its base
_TUNED_SUFFIX = re.compile(r"-(instruct|chat|it)(-v?[\d.]+)?(-hf)?$", re.IGNORECASE)


def catalog_name_for(model_id: str) -> tuple[str, str] | None:
    """(catalog entry, how it was matched) for a HuggingFace id: the entry whose source is
    that id, or whose name is its last part in lower case (meta-llama/Llama-3.1-8B ->
    llama-3.1-8b); failing both, the same for the id without a fine-tune suffix."""
    model_id = model_id.strip("/")
    for candidate in (model_id, _TUNED_SUFFIX.sub("", model_id)):
        wanted = f"huggingface.co/{candidate}/".lower()
        for path in sorted(CATALOG_DIR.glob("*.yaml")):
            if wanted in path.read_text(encoding="utf-8").lower():
                found = path.stem
                break
        else:
            last = candidate.rsplit("/", 1)[-1].lower()
            found = last if last in list_models() else None
        if found is not None:
            same = "" if candidate == model_id else f", the shapes of its base {candidate}"
            return found, same
    return None


def _dtype(text: Any, where: str) -> str:
    """vLLM's dtype spelling ('bfloat16', 'torch.float16', 'half') as infersim's."""
    value = str(text).lower().removeprefix("torch.")
    names = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16"}
    if value not in names:
        raise InfersimError(f"{where} {text!r}: infersim replays bfloat16 or float16 runs only")
    return names[value]


_FLAGS = {"enable_chunked_prefill", "enable_prefix_caching", "enforce_eager",
          "async_scheduling", "enable_expert_parallel", "disable_custom_all_reduce"}  # fmt: skip
_FRACTIONS = {"gpu_memory_utilization"}
_TEXTS = {"dtype", "quantization", "kv_cache_dtype"}


def _checked(field: str, value: Any, where: str) -> Any:
    """`value` when it has the type vLLM gives `field`, else a one-line error naming
    where in meta.json it was found."""
    if field in _TEXTS:
        ok = isinstance(value, str)
        wanted = "a string"
    elif field in _FLAGS:
        ok, wanted = isinstance(value, bool), "true or false"
    elif field in _FRACTIONS:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        wanted = "a number"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        wanted = "a whole number >= 1"
    if not ok:
        raise InfersimError(f"meta.json {where}: {value!r} is not {wanted}")
    return value


class _Resolver:
    """Settings from the run, else vLLM's default; each default is recorded."""

    def __init__(self, run: MeasuredRun, version: tuple[int, int, int] | None, gpu_name: str,
                 gpu_gib: float) -> None:  # fmt: skip
        self.settings = _Settings(run.meta)
        self.version, self.gpu_name, self.gpu_gib = version, gpu_name, gpu_gib
        self.assumptions: list[str] = []
        self.disagreements: list[str] = []

    def _recorded(self, field: str) -> Any:
        """`field` as the first place records it (None if none does); a place recording
        another value is said (the engine's own value wins: it is what ran)."""
        found = self.settings.all(field)
        if not found:
            return None
        value = _checked(field, *found[0])
        if field not in _TEXTS:
            for other, where in found[1:]:
                if _checked(field, other, where) != value:
                    self.disagreements.append(
                        f"{field}: {where} says {other!r}, {found[0][1]} {value!r} "
                        f"(replayed with {value!r}, what the engine used)"
                    )
        return value

    def __call__(self, field: str, **context: Any) -> Any:
        """`field` from the run, else vLLM's default (`context`: see vllm_default)."""
        found = self._recorded(field)
        if found is not None:
            return found
        default = vllm_default(
            field, self._version_for(field), self.gpu_name, self.gpu_gib, **context
        )
        self.assumptions.append(default.line(field))
        return default.value

    def optional(self, field: str) -> Any:
        return self._recorded(field)

    def _version_for(self, field: str) -> tuple[int, int, int]:
        """The run's vLLM version, needed for `field`'s default."""
        if self.version is None:
            raise InfersimError(
                f"{field}: not recorded in the run and its vLLM version is unknown; pass "
                "--vllm-version so infersim can use that version's defaults"
            )
        return self.version

    def batch_limits(self, *, chunked_prefill: bool, max_model_len: int) -> dict[str, int]:
        """max_num_seqs and max_num_batched_tokens from the run, else vLLM's defaults,
        where one recorded bounds the other's default (vllm_defaults.batch_limits)."""
        given = {name: self._recorded(name) for name in BATCH_LIMITS}
        unset = [name for name, value in given.items() if value is None]
        if unset:
            chosen = batch_limits(
                self._version_for(unset[0]),
                self.gpu_name,
                self.gpu_gib,
                **given,
                chunked_prefill=chunked_prefill,
                max_model_len=max_model_len,
            )
            for name, default in chosen.items():
                self.assumptions.append(default.line(name))
                given[name] = default.value
        return given


def _hardware(
    run: MeasuredRun, options: ReplayOptions, notes: list[str]
) -> tuple[dict, str, float]:
    """The hardware section, and the GPU's name and memory as vLLM would have seen them."""
    device = run.meta.get("hardware") if isinstance(run.meta.get("hardware"), dict) else {}
    device_name = str(device.get("device_name") or "")
    gpu = options.gpu
    if gpu is not None and device_name:
        notes.append(f"GPU: {gpu} (--gpu; the run was on {device_name!r})")
    if gpu is None:
        if not device_name:
            raise InfersimError(f"{run.source}: the run does not name its GPU; pass --gpu")
        gpu = gpu_preset_for(device_name)
        if gpu is None:
            raise InfersimError(
                f"meta.json hardware.device_name {device_name!r} matches no GPU preset; pass "
                "--gpu (`infersim hardware list`)"
            )
        notes.append(f"GPU: {gpu} (meta.json hardware.device_name {device_name!r})")
    spec = load_gpu(gpu)
    memory = device.get("device_total_memory_bytes")
    if memory is not None:
        _checked("device_total_memory_bytes", memory, "hardware.device_total_memory_bytes")
    gib = spec.memory.visible_gib if memory is None else memory / 2**30
    calibration = options.calibration
    if calibration is None:
        calibration = spec.name if spec.name in list_calibrations() else NO_CALIBRATION
        why = "its shipped profile" if calibration != NO_CALIBRATION else "none shipped for it"
        notes.append(f"calibration: {calibration} ({why}; --calibration to choose)")
    hardware = {"gpu": gpu, "calibration": None if calibration == NO_CALIBRATION else calibration}
    if options.node:
        hardware["node"] = options.node
    return hardware, device_name or spec.display_name, gib


def _model(run: MeasuredRun, options: ReplayOptions, notes: list[str]) -> str:
    if options.model:
        return options.model
    if not run.model:
        raise InfersimError(f"{run.source}: the run does not name its model; pass --model")
    found = catalog_name_for(str(run.model))
    if found is None:
        raise InfersimError(
            f"model {run.model!r} is not in the catalog (known: {', '.join(list_models())}); "
            "pass --model with a catalog name or a config.json"
        )
    name, how = found
    notes.append(f"model: {name} (the run's {run.model!r}{how})")
    return name


def _parallelism(setting: _Resolver, arch: ModelArchitecture, notes: list[str]) -> dict:
    """tp, pp, dp and expert parallelism, as the run's server was launched."""
    par = {
        "tp": setting("tensor_parallel_size"),
        "pp": setting("pipeline_parallel_size"),
        "dp": setting("data_parallel_size"),
    }
    if setting("enable_expert_parallel"):
        if arch.is_moe:
            par["enable_expert_parallel"] = True
        else:
            notes.append("enable_expert_parallel is on but the model is dense: vLLM ignores it")
    if par["dp"] > 1 and arch.is_moe:
        setting.assumptions.append(
            "all2all_backend = allgather_reducescatter (vLLM's default; a run does not "
            "record VLLM_ALL2ALL_BACKEND)"
        )
    if par["tp"] > 1:
        _all_reduce(setting, par)
    return par


def _all_reduce(setting: _Resolver, par: dict) -> None:
    """The TP all-reduce's switches: --disable-custom-all-reduce as recorded (vLLM's
    default: off), and VLLM_ALLREDUCE_USE_SYMM_MEM, which no run records, as the
    version's default (vllm_defaults.symm_mem_default: it has moved several times)."""
    if setting.optional("disable_custom_all_reduce"):
        par["disable_custom_all_reduce"] = True
    unrecorded = "a run does not record VLLM_ALLREDUCE_USE_SYMM_MEM"
    if setting.version is None:
        setting.assumptions.append(
            "allreduce_use_symm_mem = true (vLLM's main branch and 0.18 on; off in 0.10.2 "
            "and from 0.11.1 to a release before 0.18; the run's version is unknown and "
            f"{unrecorded})"
        )
        return
    default = symm_mem_default(setting.version)
    par["allreduce_use_symm_mem"] = default.value
    setting.assumptions.append(
        f"allreduce_use_symm_mem = {str(default.value).lower()} ({default.reason}; {unrecorded})"
    )


def _dtypes(setting: _Resolver) -> dict[str, str]:
    """Weight, KV-cache and activation types from dtype, quantization and kv_cache_dtype."""
    quantization = setting.optional("quantization")
    if quantization not in (None, "fp8"):
        raise InfersimError(
            f"quantization {quantization!r}: infersim replays unquantized or fp8 weights only"
        )
    dtype = setting.optional("dtype")
    if dtype in (None, "auto"):
        setting.assumptions.append("dtype = bf16 (the checkpoint's own type, 'auto': assumed bf16)")
        activation = "bf16"
    else:
        activation = _dtype(dtype, "dtype")
    kv = str(setting.optional("kv_cache_dtype") or "auto")
    if kv == "auto":
        kv_dtype = activation
    else:
        kv_dtype = "fp8" if kv.startswith("fp8") else _dtype(kv, "kv_cache_dtype")
    weights = "fp8" if quantization else activation
    return {"weight_dtype": weights, "kv_dtype": kv_dtype, "activation_dtype": activation}


def _serving(setting: _Resolver, arch: ModelArchitecture, notes: list[str]) -> dict[str, Any]:
    chunked = setting("enable_chunked_prefill")
    if not chunked:
        notes.append(
            "chunked prefill off: replayed with infersim's `continuous` policy, which "
            "models vLLM v0's prefill-first scheduler"
        )
    max_len = setting.optional("max_model_len")
    context = max_len or arch.max_position_embeddings
    serving = {
        "policy": "chunked_prefill" if chunked else "continuous",
        **setting.batch_limits(chunked_prefill=chunked, max_model_len=context),
        "block_size": setting("block_size"),
        "gpu_memory_utilization": setting("gpu_memory_utilization"),
        "enable_prefix_caching": setting("enable_prefix_caching"),
    }
    blocks = setting.optional("num_gpu_blocks")
    if blocks is not None:
        serving["num_gpu_blocks"] = blocks
    else:
        notes.append("num_gpu_blocks not recorded: the KV cache is sized by infersim's planner")
    if max_len is not None:
        serving["max_model_len"] = max_len
    else:
        notes.append(f"max_model_len not recorded: the model's context ({context:,})")
    return serving


def _check_recorded(run: MeasuredRun, setting: _Resolver, serving: dict, given: set[str]) -> None:
    """Refuse a meta.json that contradicts itself or its requests (unless the setting
    in question is given with --set, the keys in `given`): which side is wrong cannot
    be told, and replaying either would be silently wrong."""
    blocks, size = serving.get("num_gpu_blocks"), serving["block_size"]
    tokens = setting.settings.place("kv_cache").get("num_kv_tokens")
    kv_given = given & {"serving.num_gpu_blocks", "serving.block_size"}
    if blocks is not None and tokens is not None and tokens != blocks * size and not kv_given:
        raise InfersimError(
            f"meta.json kv_cache.num_kv_tokens {tokens!r} is not num_gpu_blocks x block_size "
            f"({blocks} x {size} = {blocks * size}): the run contradicts itself; fix "
            "meta.json or give both with --set"
        )
    _check_batch_limits(setting, serving, given)
    max_len = serving.get("max_model_len")
    if max_len is None or "serving.max_model_len" in given:
        return
    lengths = run.requests["prompt"] + run.requests["output"]
    if longer := int((lengths > max_len).sum()):
        raise InfersimError(
            f"meta.json {setting.settings.get('max_model_len')[1]} {max_len}: {longer} of the "
            f"run's requests are longer (up to {int(lengths.max()):,} tokens of prompt and "
            "output), which that engine would have refused: the setting is not this run's "
            "(--set serving.max_model_len=N to replay anyway)"
        )


def _check_batch_limits(setting: _Resolver, serving: dict, given: set[str]) -> None:
    """Refuse a budget below the sequences where one of the two is the version's default
    (vLLM refuses that at start-up, so the run must have set it): replayed, the message
    would tell the user to change a setting the run never recorded."""
    seqs, tokens = serving["max_num_seqs"], serving["max_num_batched_tokens"]
    defaulted = [
        name
        for name in BATCH_LIMITS
        if setting.optional(name) is None and f"serving.{name}" not in given
    ]
    if tokens < seqs and defaulted:
        raise InfersimError(
            f"{defaulted[0]}: not recorded in the run, and vLLM {version_text(setting.version)}'s "
            f"default makes max_num_batched_tokens {tokens} below max_num_seqs {seqs}, which "
            f"that release refuses at start-up: the run must have set it (--set "
            f"serving.{defaulted[0]}=N)"
        )


def _max_model_len_that_started(scenario: Scenario, notes: list[str]) -> BuiltScenario:
    """The scenario at the model's context, or, where vLLM would have refused to start
    with it (the KV cache cannot hold one such sequence), at the largest max_model_len
    that fits: the run started, so it must have set one at most that long. Built, as
    the check needs and the replay runs it."""
    try:
        return build_scenario(scenario)
    except MaxModelLenRefused as exc:
        if not exc.longest:
            raise
        notes.append(
            "max_model_len: vLLM would refuse to start this replica at the model's context "
            "(one sequence does not fit its KV cache), so the run set a shorter one: "
            f"replayed at the largest that fits, {exc.longest:,}"
        )
        return build_scenario(scenario.with_overrides([f"serving.max_model_len={exc.longest}"]))


def _engine(setting: _Resolver, pp: int, notes: list[str]) -> dict[str, bool]:
    async_scheduling = setting("async_scheduling")
    if async_scheduling and pp > 1:
        notes.append("async scheduling off: vLLM does not run it with pipeline parallelism")
    return {
        "cuda_graphs": not setting("enforce_eager"),
        "async_scheduling": bool(async_scheduling and pp == 1),
    }


def _frontend(run: MeasuredRun, notes: list[str]) -> dict[str, Any] | None:
    """The API server front end a simulated run's latencies went through (infersim_meta's
    `frontend`, as `infersim run --bench-json` records it), so that replaying infersim's
    own file reproduces it; None otherwise: the engine alone, unless --set
    frontend.kind=vllm_api_server models the API server a real client measured through."""
    frontend = run.meta.get("frontend")
    if frontend is None:
        return None
    if not isinstance(frontend, dict):
        raise InfersimError(f"{run.source}: infersim_meta.frontend must be an object")
    notes.append(f"front end: {frontend.get('kind')} (the simulated run's own, infersim_meta)")
    return frontend


def write_trace(run: MeasuredRun, trace: Path) -> None:
    """The run's arrivals and lengths as an infersim trace, in arrival order."""
    pd.DataFrame(
        {
            "arrived_at": run.requests["arrival"],
            "num_prefill_tokens": run.requests["prompt"],
            "num_decode_tokens": run.requests["output"],
        }
    ).to_csv(trace, index=False)


def replay_scenario(
    run: MeasuredRun, trace: Path, options: ReplayOptions
) -> tuple[BuiltScenario, list[str]]:
    """The scenario replaying `run` (its arrivals and lengths written to `trace`), built
    once (the max_model_len check's build is the one simulated, unless --set changes
    the scenario after it), and the lines saying what was taken from where and what
    was assumed."""
    notes: list[str] = []
    hardware, gpu_name, gpu_gib = _hardware(run, options, notes)
    model_name = _model(run, options, notes)
    arch = load_model(model_name)
    text = options.vllm_version or run.vllm_version
    setting = _Resolver(run, parse_version(text) if text else None, gpu_name, gpu_gib)
    parallelism = _parallelism(setting, arch, notes)
    sections = {
        "name": f"replay-{run.name}",
        "hardware": hardware,
        "model": {"name": model_name, **_dtypes(setting)},
        "parallelism": parallelism,
        "serving": _serving(setting, arch, notes),
        "engine": _engine(setting, parallelism["pp"], notes),
        "workload": {
            "arrivals": {"kind": "trace", "path": str(trace.resolve())},
            "num_requests": len(run.requests),
        },
        "output": {"plots": False, "progress": False},
    }
    if frontend := _frontend(run, notes):
        sections["frontend"] = frontend
    given = {item.split("=", 1)[0].strip() for item in options.overrides}
    _check_recorded(run, setting, sections["serving"], given)
    write_trace(run, trace)
    scenario = Scenario.from_dict(sections, source=str(run.source))
    built = None
    if setting.optional("max_model_len") is None and "serving.max_model_len" not in given:
        built = _max_model_len_that_started(scenario, notes)  # of the run's own settings
        scenario = built.scenario
    notes += setting.disagreements
    notes += [f"assumed {line}" for line in setting.assumptions]
    notes += [f"--set {item} (applied last)" for item in options.overrides]
    if built is None or options.overrides:
        built = build_scenario(scenario.with_overrides(list(options.overrides)))
    return built, notes
