"""Replay a real serving run through the simulator: read the run (a run folder or a vLLM
bench serve JSON), build the scenario its engine settings describe (vLLM's defaults for
its version where it is silent), simulate its own arrivals and lengths, and compare
latencies, the engine's own log and the decode step time (`infersim replay RUN`)."""

from simulator.replay.config import ReplayOptions
from simulator.replay.measured import MeasuredRun
from simulator.replay.replay import Replay, read_run, replay, report_text

__all__ = ["MeasuredRun", "Replay", "ReplayOptions", "read_run", "replay", "report_text"]
