"""infersim's Python API: build a scenario, simulate it, read and compare the results.

    import simulator as sim

    scenario = sim.Scenario.from_yaml("scenarios/quickstart.yaml", ["workload.num_requests=500"])
    results = sim.simulate(scenario, progress=False)
    results.summary()["latency"]["ttft"]["p99"]

Names are imported on first use (a module-level `__getattr__`), so `import simulator` costs
nothing: the CLI's start-up and a notebook's first cell do not pay for pandas, SimPy or
matplotlib before they need them. Plot helpers live in `simulator.plotting`, parameter
sweeps in `simulator.sweep`; docs/API.md walks through all of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hardware_models.lazy import lazy_names

if TYPE_CHECKING:
    from hardware_models.presets import (
        list_calibrations,
        list_gpus,
        list_nodes,
        load_gpu,
        load_node,
    )
    from simulator.compare import compare_table
    from simulator.memory_planner import plan_memory
    from simulator.model_catalog import list_models, load_model
    from simulator.model_description import describe_model
    from simulator.results import Results
    from simulator.scenario import Scenario
    from simulator.simulation import simulate
    from simulator.sizing import quick_inference_gpus

_SOURCES: dict[str, str] = {
    "Scenario": "simulator.scenario",
    "simulate": "simulator.simulation",
    "Results": "simulator.results",
    "compare_table": "simulator.compare",
    "load_model": "simulator.model_catalog",
    "list_models": "simulator.model_catalog",
    "plan_memory": "simulator.memory_planner",
    "describe_model": "simulator.model_description",
    "quick_inference_gpus": "simulator.sizing",
    "load_gpu": "hardware_models.presets",
    "list_gpus": "hardware_models.presets",
    "load_node": "hardware_models.presets",
    "list_nodes": "hardware_models.presets",
    "list_calibrations": "hardware_models.presets",
}

__all__ = [
    "Results",
    "Scenario",
    "compare_table",
    "describe_model",
    "list_calibrations",
    "list_gpus",
    "list_models",
    "list_nodes",
    "load_gpu",
    "load_model",
    "load_node",
    "plan_memory",
    "quick_inference_gpus",
    "simulate",
]


__getattr__, __dir__ = lazy_names(__name__, _SOURCES, __all__)
