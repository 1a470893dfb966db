"""The run's state (`FederationState`): the phase in progress and its progress, what phases published, and the engine's
own bookkeeping in typed fields of its own (client-query totals, the weights each client holds from a query, the loop
chosen, the nested-phase cursor, once-only query answers). `flsuite.federation.checkpoint` writes and reads it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from flsuite.federation.client_states import ClientStates
from flsuite.federation.local.choice import LoopChoice
from flsuite.federation.task import State, Weights
from flsuite.federation.written_once import WrittenOnce


@dataclass
class QueryTotals:
    """A client query's traffic over the run (`query/<name>/...` in the summary)."""

    calls: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    def add(self, bytes_up: int, bytes_down: int) -> None:
        self.calls, self.bytes_up, self.bytes_down = (
            self.calls + 1,
            self.bytes_up + bytes_up,
            self.bytes_down + bytes_down,
        )

    def as_record(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class QueryAnswer:
    """A query asked once per run (`RunContext.query_once`): the server's reduction of the answers (`value`, tensors
    and plain containers), the seconds the exchange and the reduction took, and the bytes each way."""

    value: Any
    seconds: float
    bytes_up: int
    bytes_down: int

    def as_record(self) -> dict[str, Any]:
        return {"value": self.value, "seconds": self.seconds, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down}


@dataclass
class FederationState:
    """The whole run after `round` completed rounds of phase `phase` (an index into the protocol).

    `global_weights`, `server_state`, `client_states`, `step_states` (one per server step) and `initial_weights` (the
    phase's W₀, from which a client's initial state is made when it is first sampled) belong to the phase in
    progress; `outputs` holds what phases published, one value per phase name (`RunContext.publish`), and nothing else.
    `generation` counts the checkpoints that wrote client-state files (their names carry it).

    The engine's bookkeeping (`RunContext` and `Federation` write it, phases never do):
    `queries`: query name → its traffic so far; `query_weights`: client → digest of the model weights a query last sent
    it (sent again only when they change); `local_loop`: the loop chosen for the run (`local.loop: auto`, chosen once);
    `nested`: outer phase → the nested phase it is running (`RunContext.run_nested`); `answers`: owner → key → a
    once-only query's answer (`RunContext.query_once`).
    """

    round: int
    global_weights: Weights
    server_state: State
    client_states: ClientStates
    history: list[dict[str, Any]] = field(default_factory=list)
    timings: list[dict[str, Any]] = field(default_factory=list)
    config_yaml: str = ""
    phase: int = 0
    step_states: list[State] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    initial_weights: Weights = field(default_factory=dict)
    generation: int = 0
    queries: dict[str, QueryTotals] = field(default_factory=dict)
    query_weights: dict[int, str] = field(default_factory=dict)
    local_loop: LoopChoice | None = None
    nested: dict[str, str] = field(default_factory=dict)
    answers: dict[str, dict[str, QueryAnswer]] = field(default_factory=dict)
    #: The files that hold `outputs` and `answers` (each written once: `flsuite.federation.written_once`).
    written: WrittenOnce = field(default_factory=WrittenOnce, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.client_states, ClientStates):  # a plain mapping: every state given
            self.client_states = ClientStates(values=self.client_states)

    @classmethod
    def empty(cls, phase: int = 0) -> FederationState:
        return cls(round=0, global_weights={}, server_state={}, client_states=ClientStates(), phase=phase)

    def enter_phase(self, phase: int) -> None:
        """Start phase `phase` afresh (its own weights and states); history, outputs and bookkeeping carry over."""
        self.phase = phase
        self.restart_phase()

    def restart_phase(self) -> None:
        """The phase in progress starts its rounds afresh (a nested phase: FKPL's next expert)."""
        self.round, self.global_weights, self.server_state, self.step_states = 0, {}, {}, []
        self.client_states, self.initial_weights = ClientStates(), {}
