"""What a workload is, as a scenario file states it: arrivals, lengths, classes, stop.

Every variant is selected by its `kind`, so a typo in a kind is reported with the list of
known kinds (and a close match) rather than as a failure of each union member in turn.
Paths inside the config are relative to the scenario file's folder, passed at generation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from hardware_models.yaml_io import unknown_name_error
from simulator.workload.trace_layouts import OUTPUT_COLUMN, PROMPT_COLUMN, TimeUnit, TraceLayout
from simulator.workload.traces import MAX_TOKENS

MAX_REQUESTS = 100_000_000
"""Most requests one workload may send: beyond it the request table alone needs GBs."""
MAX_TIME_S = 10_000_000_000
"""Longest simulated span, s (~300 years): past it a float64 clock can no longer resolve
an engine step, so times beyond it (a horizon, a think time, an arrival) are refused."""


class _Strict(BaseModel):
    # inf passes gt/ge bounds but no workload quantity is infinite (NaN fails them anyway)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---- arrivals -----------------------------------------------------------------------------


class PoissonArrivals(_Strict):
    """Open loop, independent users: exponential inter-arrival times."""

    kind: Literal["poisson"] = "poisson"
    rate_per_s: float = Field(gt=0, description="mean arrival rate, requests per second")


class GammaArrivals(_Strict):
    """Open loop with tunable burstiness: gamma-distributed inter-arrival times."""

    kind: Literal["gamma"] = "gamma"
    rate_per_s: float = Field(gt=0, description="mean arrival rate, requests per second")
    cv: float = Field(
        ge=1e-3,
        le=1000,
        description="coefficient of variation of inter-arrival times: 1 is Poisson, "
        "> 1 bursty, < 1 more regular",
    )


class ConstantArrivals(_Strict):
    """Open loop, perfectly regular: one request every 1 / rate_per_s seconds."""

    kind: Literal["constant"] = "constant"
    rate_per_s: float = Field(gt=0, description="arrival rate, requests per second")


ThinkTime = Annotated[
    float,
    Field(
        default=0.0,
        ge=0,
        le=MAX_TIME_S,
        description="mean pause between a completion and the next request",
    ),
]
ThinkDistribution = Annotated[
    Literal["exponential", "constant"],
    Field(default="exponential", description="distribution of the think time around its mean"),
]


class ClosedLoopArrivals(_Strict):
    """A fixed population of users, each sending its next request a think time after
    the previous one completes. Load adapts to the server, as in a benchmark client."""

    kind: Literal["closed_loop"] = "closed_loop"
    users: int = Field(
        ge=1, le=MAX_REQUESTS, description="concurrent users (requests in flight at most)"
    )
    think_time_s: ThinkTime
    think_distribution: ThinkDistribution


TRACE_PATH = (
    "trace file (.csv, .jsonl, or a vllm bench serve --save-detailed result .json), "
    "relative to the scenario file"
)


class TraceColumns(_Strict):
    """Which columns of a trace file of any other layout are the arrival time and the
    prompt and output lengths, and the unit of its arrival times. In JSONL a dotted name
    (usage.prompt_tokens) reaches into nested objects."""

    arrival: str = Field(min_length=1, description="column of arrival times")
    prompt: str = Field(
        default=PROMPT_COLUMN, min_length=1, description="column of prompt lengths, tokens"
    )
    output: str = Field(
        default=OUTPUT_COLUMN, min_length=1, description="column of output lengths, tokens"
    )
    time_unit: TimeUnit = Field(
        default="s",
        description="arrival times in s, ms or us, or datetime: a date and time (ISO 8601, "
        "e.g. 2023-11-16 18:15:46.68); either way counted from the earliest row's (Unix "
        "time replays from its first request; the run says by how much it shifted)",
    )

    def layout(self) -> TraceLayout:
        return TraceLayout("mapping", self.arrival, self.prompt, self.output, self.time_unit)


class TraceArrivals(_Strict):
    """Replay the arrival times of a trace file (CSV or JSONL). Its layout is recognised
    from its columns: infersim's (arrived_at in s, num_prefill_tokens, num_decode_tokens),
    BurstGPT's (Timestamp in s, Request tokens, Response tokens), Azure 2023's (TIMESTAMP a
    date and time, ContextTokens, GeneratedTokens) or Mooncake's JSONL (timestamp in ms,
    input_length, output_length, hash_ids); `columns` names them in any other file. A
    `vllm bench serve --save-result --save-detailed` result (.json) gives its start_times
    and input_lens/output_lens. Times count from the earliest row; rows out of order are
    replayed in arrival order (both said). Its length columns give the lengths unless
    prompt_tokens/output_tokens say otherwise."""

    kind: Literal["trace"] = "trace"
    path: str = Field(min_length=1, description=TRACE_PATH)
    time_scale: float = Field(
        default=1.0,
        gt=0,
        description="multiplies every arrival time: 0.5 replays the trace at twice its rate",
    )
    columns: TraceColumns | None = Field(
        default=None,
        description="which columns are which, for a file in none of the known layouts",
    )
    hash_block_tokens: int = Field(
        default=512,
        ge=1,
        le=MAX_TOKENS,
        description="prompt tokens each of a Mooncake trace's hash_ids stands for (Mooncake "
        "hashes blocks of 512); with serving.enable_prefix_caching, requests sharing "
        "leading hashes share those blocks in the prefix cache",
    )


class OfflineArrivals(_Strict):
    """Every request arrives at t = 0, as in an offline (MLPerf Offline style) run: the
    replicas work through a queue of num_requests as fast as they can. Cheaper to
    simulate than a closed loop with as many users, and the same workload."""

    kind: Literal["offline"] = "offline"


ARRIVAL_KINDS = ("poisson", "gamma", "constant", "closed_loop", "trace", "offline")

RateArrivals = PoissonArrivals | GammaArrivals | ConstantArrivals
"""The synthetic open-loop processes, defined by a rate."""


# ---- lengths ------------------------------------------------------------------------------


class FixedLength(_Strict):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(
        ge=1,
        le=MAX_TOKENS,
        description="tokens per request (>= 1: a prompt is not empty and a generation "
        "request yields at least its first token)",
    )


class UniformLength(_Strict):
    """Lengths drawn uniformly from the integers low..high, both included."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_TOKENS, description="smallest length, tokens")
    high: int = Field(ge=1, le=MAX_TOKENS, description="largest length, tokens (>= low)")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


class _Clipped(_Strict):
    min: int = Field(
        default=1, ge=1, le=MAX_TOKENS, description="draws below this are raised to it, tokens"
    )
    max: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="draws above this are lowered to it, tokens"
    )

    @model_validator(mode="after")
    def _ordered(self) -> _Clipped:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class NormalLength(_Clipped):
    """Normally distributed lengths, rounded to whole tokens and clipped to [min, max]."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(ge=0, description="mean before clipping, tokens")
    std: float = Field(ge=0, description="standard deviation before clipping, tokens")


class LognormalLength(_Clipped):
    """Log-normally distributed lengths (right-skewed, as real prompt and output lengths
    are), rounded and clipped to [min, max]. `mean` and `std` are those of the lengths
    themselves, not of their logarithm: sigma^2 = ln(1 + std^2 / mean^2) and
    mu = ln(mean) - sigma^2 / 2."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, description="mean length before clipping, tokens")
    std: float = Field(ge=0, description="standard deviation of the length, tokens")


class TraceLength(_Strict):
    """Lengths drawn with replacement from a column of a trace file. When prompt and
    output lengths come from the same file they are drawn from the same rows, so the
    file's pairing of prompt and output lengths is kept."""

    kind: Literal["trace"] = "trace"
    path: str = Field(min_length=1, description=TRACE_PATH)
    column: str | None = Field(
        default=None,
        min_length=1,
        description="column to draw from; default the prompt (for prompt lengths) or output "
        "column of the file's layout, recognised as for arrivals (num_prefill_tokens / "
        "num_decode_tokens in infersim's own)",
    )

    @model_validator(mode="before")
    @classmethod
    def _path_given(cls, value: Any) -> Any:
        """`{kind: trace}` alone reads as "the arrivals trace's lengths": say how to get those."""
        if isinstance(value, dict) and "path" not in value:
            raise ValueError(
                "path is required (the trace file to draw lengths from, with replacement); "
                "to take each request's lengths from the arrivals trace row by row, leave "
                "prompt_tokens/output_tokens out"
            )
        return value


SYNTHETIC_LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal")
LENGTH_KINDS = (*SYNTHETIC_LENGTH_KINDS, "trace")

SyntheticLength = FixedLength | UniformLength | NormalLength | LognormalLength
"""The length distributions that need no file."""


# ---- unions with a clear error for an unknown kind ----------------------------------------


def _known_kind(what: str, kinds: tuple[str, ...]) -> BeforeValidator:
    """Reject a missing or unknown `kind` in one line, with a close match when there is one."""

    def check(value: Any) -> Any:
        if isinstance(value, dict):
            kind = value.get("kind")
            if kind is None:
                raise ValueError(f"missing 'kind' (one of: {', '.join(kinds)})")
            if kind not in kinds:
                raise ValueError(str(unknown_name_error(f"{what} kind", str(kind), list(kinds))))
        return value

    return BeforeValidator(check)


Arrivals = Annotated[
    PoissonArrivals
    | GammaArrivals
    | ConstantArrivals
    | ClosedLoopArrivals
    | TraceArrivals
    | OfflineArrivals,
    Field(discriminator="kind"),
    _known_kind("arrivals", ARRIVAL_KINDS),
]
LengthSpec = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | TraceLength,
    Field(discriminator="kind"),
    _known_kind("length", LENGTH_KINDS),
]


# ---- multi-turn sessions ------------------------------------------------------------------


def _turns_shorthand(value: Any) -> Any:
    """`turns: 4` means every session has 4 turns."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number of turns or a distribution, got {value!r}")
    if isinstance(value, int):
        return {"kind": "fixed", "tokens": value}
    return value


_TurnDistribution = Annotated[SyntheticLength, Field(discriminator="kind")]
TurnSpec = Annotated[
    _TurnDistribution,
    _known_kind("turns", SYNTHETIC_LENGTH_KINDS),
    BeforeValidator(_turns_shorthand, json_schema_input_type=int | _TurnDistribution),
]


class SessionConfig(_Strict):
    """Multi-turn chat sessions. `arrivals` then starts sessions (its rate is sessions per
    second); each session sends its turns one after another, turn k + 1 a think time after
    turn k's response completed. Turn 1's prompt is drawn from prompt_tokens; turn k + 1's
    prompt is the whole conversation so far (turn k's prompt and output) plus new user
    tokens drawn from prompt_tokens. Every turn is one request (num_requests counts turns).

    A session ends early, without sending the turn, when that turn's prompt + output
    would exceed the context: the smaller of max_total_tokens and the smallest
    max_model_len of the cluster (turn 1 is drawn and clipped like any request). It also
    ends when a turn is rejected or fails (the user gives up), and when the next turn
    would arrive at or after duration_s or beyond num_requests."""

    turns: TurnSpec = Field(
        description="turns per session: a number, or a distribution (fixed, uniform, "
        "normal, lognormal; its `tokens`, `mean`, `min`... are read as turns), rounded "
        "to 1..100,000"
    )
    think_time_s: ThinkTime
    think_distribution: ThinkDistribution


# ---- the workload ------------------------------------------------------------------------


class PriorityClass(_Strict):
    """A class of requests, e.g. interactive vs batch, that a scheduler may favour."""

    name: str = Field(min_length=1, description="label used in results")
    weight: float = Field(default=1.0, gt=0, description="relative share of requests")
    priority: int = Field(
        default=0,
        ge=-128,
        le=127,
        description="lower is more important (-128..127); other than 0 only with "
        "serving.scheduling_policy: priority, as vLLM",
    )


def _default_classes() -> list[PriorityClass]:
    return [PriorityClass(name="default")]


NO_STOP_CONDITION = "give a stop condition: num_requests and/or duration_s (whichever comes first)"


class WorkloadConfig(_Strict):
    """The requests a simulation serves: when they arrive, how long they are, their class,
    and when to stop sending them (num_requests and/or duration_s, whichever comes first;
    a trace replay without either stops at the trace's end).

    Lengths are drawn, clipped to the distribution's own min/max, multiplied by the length
    scale and rounded (at least 1 token each); max_total_tokens is applied last.
    """

    arrivals: Arrivals = Field(description="when requests arrive")
    prompt_tokens: LengthSpec | None = Field(
        default=None,
        description="prompt length distribution (with sessions: the new user tokens of "
        "each turn); default: the arrivals trace's num_prefill_tokens, row by row",
    )
    output_tokens: LengthSpec | None = Field(
        default=None,
        description="output length distribution; default: the arrivals trace's "
        "num_decode_tokens, row by row",
    )
    prompt_length_scale: float = Field(
        default=1.0, gt=0, description="multiplies every prompt length (then rounded)"
    )
    output_length_scale: float = Field(
        default=1.0, gt=0, description="multiplies every output length (then rounded)"
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=2,
        le=MAX_TOKENS,
        description="cap on prompt + output tokens per request (e.g. the model's context)",
    )
    max_total_policy: Literal["output_first", "proportional"] = Field(
        default="output_first",
        description="how max_total_tokens clips: output_first shortens the output (down to "
        "1 token) and then the prompt; proportional removes the excess from both in "
        "proportion to their lengths, as Vidur and Sarathi-Serve clip traces",
    )
    zero_token_rows: Literal["drop", "one_token"] = Field(
        default="drop",
        description="trace rows with 0 prompt or output tokens (BurstGPT logs its failed "
        "requests with 0 response tokens): drop leaves them out, and the run says how many; "
        "one_token replays them as requests of 1 token",
    )
    priorities: list[PriorityClass] = Field(
        default_factory=_default_classes,
        min_length=1,
        description="request classes; each request is assigned one at random by weight",
    )
    sessions: SessionConfig | None = Field(
        default=None,
        description="multi-turn chat: arrivals start sessions whose turns follow each "
        "other, each prompt holding the conversation so far",
    )
    num_requests: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REQUESTS,
        description="stop after this many requests (with sessions: turns); a trace replay "
        "with neither this nor duration_s replays the whole trace",
    )
    duration_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIME_S,
        description="stop sending requests at this simulated time, s",
    )

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        if self.num_requests is None and self.duration_s is None and self.arrivals.kind != "trace":
            raise ValueError(NO_STOP_CONDITION)  # a trace has its own end: its last row
        if self.arrivals.kind != "trace":
            for role in ("prompt_tokens", "output_tokens"):
                if getattr(self, role) is None:
                    raise ValueError(
                        f"{role} is required unless arrivals.kind is 'trace' "
                        f"(arrivals.kind is {self.arrivals.kind!r})"
                    )
        if self.arrivals.kind == "offline" and self.num_requests is None:
            raise ValueError(
                "num_requests: offline arrivals send every request at t = 0, so give "
                "num_requests (how many there are)"
            )
        if self.sessions is not None and self.arrivals.kind not in ("poisson", "gamma", "constant"):
            raise ValueError(
                f"sessions: sessions start by a rate process (arrivals.kind poisson, gamma "
                f"or constant: sessions per second), got arrivals.kind {self.arrivals.kind!r}"
            )
        names = [c.name for c in self.priorities]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"priorities: duplicate class name(s) {', '.join(duplicates)}")
        return self
