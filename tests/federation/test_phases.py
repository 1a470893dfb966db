"""Protocols of phases, server context and steps, client queries, per-client broadcasts, read-only hyperparameters,
communication accounting, and rounds committed only when complete (interrupts anywhere resume exactly)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.method import ClientModule, HyperParameters
from flsuite.federation.phases import Rounds
from flsuite.federation.query import ClientQuery, ask, in_process
from flsuite.federation.server import PublicData, ServerFinetune, ServerStep
from flsuite.federation.task import ServerUpdate
from flsuite.federation.weights import num_bytes
from flsuite.interrupts import RunInterrupted
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.ggeur import GGEUR
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import MLP, Linear
from flsuite.seeding import derive_seed
from tests.helpers import head_federation


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def public_data() -> PublicData:
    return PublicData(
        GaussianFeatures(
            dim=8, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=40, test_per_domain=10
        )
    )


def assert_same_weights(a, b) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---- phases ------------------------------------------------------------------------------------------------------
def two_phases(rounds_a: int = 2, rounds_b: int = 3) -> list[Rounds]:
    return [
        Rounds(name="a", rounds=rounds_a, clients=[0, 1], model=Linear(), prefix="a/"),
        Rounds(name="b", rounds=rounds_b, clients=[2, 3], model=MLP(hidden=(5,)), prefix="b/"),
    ]


def test_two_phase_protocol_equals_two_separate_runs(tmp_path):
    both = two_phases()
    head_federation(tmp_path / "both", protocol=both).fit()
    head_federation(tmp_path / "a", protocol=[both[0]]).fit()
    head_federation(tmp_path / "b", protocol=[both[1]]).fit()
    combined = records(tmp_path / "both")
    assert [r["phase"] for r in combined] == ["a", "a", "b", "b", "b"]
    assert combined == records(tmp_path / "a") + records(tmp_path / "b")
    assert {c for r in combined[:2] for c in r["a/clients"]} == {0, 1}
    assert {c for r in combined[2:] for c in r["b/clients"]} == {2, 3}
    final = load_checkpoint(tmp_path / "both")
    assert_same_weights(final.outputs["a"]["weights"], load_checkpoint(tmp_path / "a").global_weights)
    assert_same_weights(final.global_weights, load_checkpoint(tmp_path / "b").global_weights)
    assert (
        "3.weight" not in final.outputs["a"]["weights"] and "3.weight" in final.global_weights
    )  # Linear, then the MLP


def test_a_phase_over_all_clients_without_prefix_is_the_default_protocol(tmp_path):
    head_federation(tmp_path / "default").fit()
    head_federation(tmp_path / "explicit", protocol=[Rounds(name="main")]).fit()
    assert (tmp_path / "default" / "metrics.jsonl").read_bytes() == (
        tmp_path / "explicit" / "metrics.jsonl"
    ).read_bytes()


class TwoStageFedAvg(FedAvg):
    """A method that brings its own protocol (as FKPL will)."""

    def protocol(self):
        return two_phases()


def test_a_method_can_bring_its_own_protocol_and_a_config_protocol_wins(tmp_path):
    head_federation(tmp_path / "own", method=TwoStageFedAvg()).fit()
    head_federation(tmp_path / "config", protocol=two_phases()).fit()
    assert (tmp_path / "own" / "metrics.jsonl").read_bytes() == (tmp_path / "config" / "metrics.jsonl").read_bytes()
    head_federation(tmp_path / "override", method=TwoStageFedAvg(), protocol=[Rounds()]).fit()
    assert "phase" not in records(tmp_path / "override")[0]


def test_the_summary_comes_from_the_last_phase(tmp_path):
    summary = head_federation(tmp_path, protocol=two_phases()).fit()
    last = records(tmp_path)[-1]
    assert summary["last/acc_mean"] == last["b/acc_mean"]


def test_bad_phases_are_refused_with_the_phase_named(tmp_path):
    with pytest.raises(ValueError, match="phase names must be distinct"):
        head_federation(tmp_path, protocol=[Rounds(name="x"), Rounds(name="x")])
    with pytest.raises(ValueError, match=r"phase 'x': clients \[0, 9\] but the federation has clients 0..3"):
        head_federation(tmp_path / "r", protocol=[Rounds(name="x", clients=[0, 9])]).fit()


# ---- interrupts anywhere resume to the uninterrupted run ---------------------------------------------------------
WHERE = ("client fit", "evaluation", "server step", "later phase")
TRIPPED: set[str] = set(WHERE)


def trip(where: str) -> None:
    """Raise the suite's interrupt the first time `where` is reached while armed (a real Ctrl-C raises the same)."""
    if where not in TRIPPED:
        TRIPPED.add(where)
        raise RunInterrupted()


class InterruptedClient(Scaffold.client_module):
    """Interrupts client 1's fit in round 3 at its third step (the lean loop: one `local_loss` per step)."""

    def local_loss(self, x, y):
        self.calls = getattr(self, "calls", 0) + 1
        if self.task.round == 3 and self.task.client_id == 1 and self.calls == 3:
            trip("client fit")
        return super().local_loss(x, y)


class ScaffoldWithInterruptedClient(Scaffold):
    client_module = InterruptedClient


class InterruptingStep(ServerStep):
    """Adds 0.01 to every bias (a double application would show) and counts its calls; interrupts in round 3 when
    its `key` is armed."""

    def __init__(self, key: str) -> None:
        self.key = key

    def step(self, ctx, weights, state):
        if ctx.round == 3:
            trip(self.key)
        calls = int(state.get("calls", 0)) + 1
        return ServerUpdate(
            {k: v + 0.01 if k.endswith("bias") else v for k, v in weights.items()}, {"calls": calls}, {"calls": calls}
        )


@pytest.mark.parametrize("where", WHERE)
def test_an_interrupt_anywhere_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, where):
    """SCAFFOLD (server and client state) + a server step; killed in round 3 of the (last) phase."""
    kwargs: dict = dict(rounds=4, method=Scaffold(), server_steps=[InterruptingStep(where)], checkpoint_every=10)
    if where == "later phase":
        kwargs["protocol"] = two_phases(rounds_a=2, rounds_b=3)
    TRIPPED.update(WHERE)
    head_federation(tmp_path / "full", **kwargs).fit()

    TRIPPED.discard(where)  # armed
    if where == "client fit":
        kwargs["method"] = ScaffoldWithInterruptedClient()
    if where == "evaluation":
        import flsuite.federation.phases as phases

        real, calls = phases.evaluate_federation, []

        def evaluate(*args, **kw):
            calls.append(1)
            if len(calls) == 3:  # round 3's evaluation
                trip("evaluation")
            return real(*args, **kw)

        monkeypatch.setattr(phases, "evaluate_federation", evaluate)
    with pytest.raises(RunInterrupted):
        head_federation(tmp_path / "killed", **kwargs).fit()
    assert where in TRIPPED  # it really fired
    killed = load_checkpoint(tmp_path / "killed")
    assert (killed.phase, killed.round, len(killed.history)) == ((1, 2, 4) if where == "later phase" else (0, 2, 2))
    assert killed.step_states == [{"calls": 2}]

    kwargs["method"] = Scaffold()
    head_federation(None, **kwargs).fit(resume=tmp_path / "killed")
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    full, resumed = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "killed")
    assert_same_weights(full.global_weights, resumed.global_weights)
    assert full.step_states == resumed.step_states
    assert_same_weights(full.server_state["c"], resumed.server_state["c"])
    for k in full.client_states:
        assert_same_weights(full.client_states[k]["c_i"], resumed.client_states[k]["c_i"])


# ---- server side -------------------------------------------------------------------------------------------------
def test_server_finetune_trains_the_aggregate_and_reruns_identically(tmp_path):
    head_federation(tmp_path / "plain").fit()
    head_federation(tmp_path / "a", server_steps=[ServerFinetune(public_data(), epochs=2, lr=0.1)]).fit()
    head_federation(tmp_path / "b", server_steps=[ServerFinetune(public_data(), epochs=2, lr=0.1)]).fit()
    a = records(tmp_path / "a")
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    assert [r["server/serverfinetune/steps"] for r in a] == [
        4,
        4,
        4,
    ]  # 40 samples, batch 32: 2 steps per epoch, 2 epochs
    plain = load_checkpoint(tmp_path / "plain").global_weights
    assert not torch.equal(load_checkpoint(tmp_path / "a").global_weights["1.weight"], plain["1.weight"])


def test_server_randomness_does_not_depend_on_what_clients_did_to_the_global_rng(tmp_path):
    """The serial executor's clients reseed torch's global RNG in this process; Ray's do not. A server fit seeds
    from its own derived stream, so it must not see the difference."""
    step = ServerFinetune(public_data(), epochs=1)
    head_federation(tmp_path / "a", server_steps=[step]).fit()
    step_b = ServerFinetune(public_data(), epochs=1)

    class Disturbed(FedAvg):
        def aggregate(self, *args, **kwargs):
            torch.rand(1000)  # advance the global stream before the server step
            return super().aggregate(*args, **kwargs)

    head_federation(tmp_path / "b", server_steps=[step_b], method=Disturbed()).fit()
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()


def test_server_steps_with_the_same_name_are_refused(tmp_path):
    with pytest.raises(ValueError, match="two steps share a name"):
        head_federation(tmp_path, server_steps=[ServerFinetune(public_data()), ServerFinetune(public_data())])


# ---- client queries and bytes ------------------------------------------------------------------------------------
class RowSums(ClientQuery):
    name = "row_sums"

    def compute(self, client, task, model):
        return {"sums": client.train.x.sum(dim=1), "n": torch.tensor(len(client.train))}


def test_a_client_query_counts_exactly_its_payload():
    data = GaussianFeatures(dim=4, num_classes=2, num_domains=2, clients_per_domain=2, samples_per_client=30).build(0)
    outcome = ask(in_process(data), RowSums(), [0, 2, 3], lambda k: k, broadcast={"hello": torch.zeros(5)})
    assert [r.client_id for r in outcome.results] == [0, 2, 3]
    assert outcome.bytes_up == sum(num_bytes(r.upload) for r in outcome.results) == 3 * (30 * 4 + 8)
    assert outcome.bytes_down == 3 * 5 * 4
    torch.testing.assert_close(outcome.uploads()[2]["sums"], data.clients[2].train.x.sum(dim=1))


class QueryThenTrain(Rounds):
    """A phase that first asks every client a question (a one-shot exchange), then trains."""

    def run(self, ctx):
        if "answers" not in ctx.state.outputs:
            outcome = ctx.query(RowSums(), clients=[1, 3])
            ctx.state.outputs["answers"] = {k: u["n"] for k, u in outcome.uploads().items()}
        super().run(ctx)


def test_a_phase_query_runs_on_the_executor_and_its_bytes_reach_the_summary(tmp_path):
    summary = head_federation(tmp_path, protocol=[QueryThenTrain(rounds=1)]).fit()
    assert summary["query/row_sums/calls"] == 1
    assert summary["query/row_sums/bytes_up"] == 2 * (60 * 4 + 8)  # two clients: 60 float32 row sums + an int64
    assert load_checkpoint(tmp_path).outputs["answers"] == {1: 60, 3: 60}


class AskWithWeights(Rounds):
    """Client queries that carry model weights W: to clients 0, 1; to all; W again (an equal copy); W changed."""

    def run(self, ctx):
        if "down" not in ctx.state.outputs:
            w = {k: torch.zeros_like(v) for k, v in Linear().build((8,), 3).state_dict().items()}
            changed = {**w, "1.bias": w["1.bias"] + 1}
            asks = [([0, 1], w), (None, w), (None, {k: v.clone() for k, v in w.items()}), (None, changed)]
            ctx.state.outputs["down"] = [ctx.query(RowSums(), clients=c, weights=x).bytes_down for c, x in asks]
        super().run(ctx)


def test_model_weights_a_client_already_holds_from_a_query_are_not_counted_again(tmp_path):
    summary = head_federation(tmp_path, protocol=[AskWithWeights(rounds=1)]).fit()
    w = (8 * 3 + 3) * 4  # Linear(8, 3), float32
    assert load_checkpoint(tmp_path).outputs["down"] == [2 * w, 2 * w, 0, 4 * w]  # clients 2, 3 first get W in the 2nd
    assert summary["query/row_sums/bytes_down"] == 8 * w


def test_ggeur_statistics_travel_as_a_query_and_are_counted_from_the_payload():
    data = GaussianFeatures(dim=6, num_classes=3, num_domains=2, clients_per_domain=1, samples_per_client=40).build(1)
    held = sum(int((c.train.y == k).any()) for c in data.clients for k in range(3))
    metrics = GGEUR(target_per_class=20, samples_per_prototype=5).run(data, seed=1).metrics
    assert metrics["bytes_up"] == held * (1 + 6 + 36) * 8  # per held class: n, μ, Σ in 64-bit


def test_scaffold_uploads_two_parameter_sets_and_downloads_weights_plus_c(tmp_path):
    head_federation(tmp_path, method=Scaffold()).fit()
    theta = (8 * 3 + 3) * 4  # Linear(8, 3), float32
    for r in records(tmp_path):
        assert r["bytes_up"] == 4 * 2 * theta
    assert [r["bytes_down"] for r in records(tmp_path)] == [
        4 * theta,
        4 * 2 * theta,
        4 * 2 * theta,
    ]  # c is empty in round 1


# ---- what a client receives --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EchoSettings:
    k: float


class EchoClient(ClientModule[EchoSettings]):
    def upload(self, fit):
        return {"seen_k": torch.tensor(float(self.method.k)), "own": self.task.broadcast.get("own", torch.zeros(1))}


class PerClient(FedAvg):
    """Sends each client its own id; changes its own hyperparameter every round (clients must not see that)."""

    client_module = EchoClient

    def __init__(self) -> None:
        super().__init__()
        self.k = 1.0
        self.seen: list[dict] = []

    def client_settings(self) -> EchoSettings:
        return EchoSettings(self.k)

    def broadcast_to(self, round, client_id, server_state, shared):
        return {**shared, "own": torch.tensor([float(client_id)])}

    def aggregate(self, round, global_weights, results, server_state, ctx=None):
        self.seen.append({r.client_id: (float(r.upload["seen_k"]), float(r.upload["own"])) for r in results})
        self.k += 1.0
        return super().aggregate(round, global_weights, results, server_state, ctx)


def test_clients_get_their_own_extras_and_a_read_only_snapshot_of_the_method(tmp_path):
    method = PerClient()
    head_federation(tmp_path, method=method).fit()
    assert method.seen == [{k: (1.0, float(k)) for k in range(4)}] * 3  # the start value of k, every round
    with pytest.raises(AttributeError, match="read-only"):
        HyperParameters(method).settings = EchoSettings(3.0)


# ---- a step that asks the clients once, under the initial weights ------------------------------------------------
class MeanLogitQuery(ClientQuery):
    name = "mean_logit"

    def compute(self, client, task, model):
        return {"mean": model(client.train.x).mean(dim=0)}


class AskOnceStep(ServerStep):
    """Stores every client's mean logit under W₀ in its state when the phase starts (FedEGG's τ_k has this shape)."""

    calls = 0

    def init_state(self, weights, run):
        AskOnceStep.calls += 1
        answers = run.query(MeanLogitQuery(), weights=weights).uploads()
        return {"means": [answers[k]["mean"] for k in sorted(answers)]}

    def step(self, ctx, weights, state):
        return ServerUpdate(weights, state)


def test_a_step_can_query_the_clients_under_the_initial_weights_once_and_keeps_the_answer_on_resume(tmp_path):
    AskOnceStep.calls = 0
    TRIPPED.discard("client fit")  # armed: client 1 is interrupted in round 3
    with pytest.raises(RunInterrupted):
        head_federation(
            tmp_path,
            rounds=3,
            server_steps=[AskOnceStep()],
            method=ScaffoldWithInterruptedClient(),
            checkpoint_every=10,
        ).fit()
    head_federation(None, rounds=3, server_steps=[AskOnceStep()], method=Scaffold()).fit(resume=tmp_path)
    assert AskOnceStep.calls == 1  # not asked again on resume
    state = load_checkpoint(tmp_path)
    fed = head_federation(tmp_path / "x")
    data = fed.data.build(fed.seed)
    torch.manual_seed(derive_seed(fed.seed, purpose="model_init"))  # W₀: the phase's fresh model
    model = fed.model.build(data.input_shape, data.num_classes)
    with torch.no_grad():
        expected = [model(c.train.x).mean(dim=0) for c in data.clients]
    for got, want in zip(state.step_states[0]["means"], expected):
        torch.testing.assert_close(got, want)


def test_a_local_learning_rate_schedule_changes_the_rate_at_its_milestones():
    from flsuite.federation.task import LocalTraining

    local = LocalTraining(lr=0.1, lr_milestones=[3, 5], lr_gamma=0.5)
    assert [local.lr_at(r) for r in range(1, 7)] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    assert local.make_optimizer([torch.nn.Parameter(torch.zeros(1))], round=4).param_groups[0]["lr"] == 0.05
    with pytest.raises(ValueError, match="lr_milestones must be increasing"):
        LocalTraining(lr_milestones=[5, 3])
