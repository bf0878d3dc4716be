"""Key names of the JSON `vllm bench serve --save-result --save-detailed` writes, in one
place for the reader (`infersim replay`) and the writer (`infersim run --bench-json`)
(vllm/benchmarks/serve.py; benchmarks/benchmark_serving.py before it moved). The
per-request lists are only saved with --save-detailed; `start_times` only by recent
versions. Times are in seconds, each list in request order."""

INPUT_LENS = "input_lens"
OUTPUT_LENS = "output_lens"
TTFTS = "ttfts"
ITLS = "itls"
LATENCIES = "latencies"
START_TIMES = "start_times"
ERRORS = "errors"
MODEL_ID = "model_id"
REQUEST_RATE = "request_rate"  # a number, or the string "inf"
BURSTINESS = "burstiness"
MAX_CONCURRENCY = "max_concurrency"
RAMP_UP_STRATEGY = "ramp_up_strategy"
BACKEND = "backend"
INFERSIM_BACKEND = "infersim"
"""The `backend` (and `endpoint_type`) infersim writes: the file's latencies are simulated."""
SEED = "seed"  # not written by vLLM itself; present when passed with --metadata seed=N
INFERSIM_META = "infersim_meta"
"""infersim's own addition, as vLLM's --metadata adds keys: the simulated engine's settings
shaped as a run folder's meta.json (`engine_kwargs` by vLLM's argument names,
`hardware.device_name`, and `vllm_version`, the release whose defaults the run resolved
unset settings as), so a replay of the file runs with them, not vLLM's defaults."""

DETAILED = (INPUT_LENS, OUTPUT_LENS, TTFTS, ITLS)
"""The lists a replay needs: present only when the run was saved with --save-detailed."""
