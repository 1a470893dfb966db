"""The round loop: FedAvg against hand computations, determinism, and resume-after-kill."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from flsuite.data.base import EpochBatches
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.executors import SerialExecutor
from flsuite.federation.sampling import ClientSampling
from flsuite.federation.task import ClientResult, LocalTraining
from flsuite.federation.weights import weighted_average
from flsuite.methods.fedavg import FedAvg
from flsuite.seeding import derive_seed, torch_generator
from tests.helpers import cnn_federation, head_federation


def plain_local_training(fed, local: LocalTraining, seed: int, rounds: int) -> dict[str, torch.Tensor]:
    """Plain PyTorch: the same initial model and the same batch order, no Lightning, no federation."""
    data = fed.data.build(seed)
    torch.manual_seed(derive_seed(seed, purpose="model_init"))
    model = fed.model.build(data.input_shape, data.num_classes)
    optimizer = local.make_optimizer(model.parameters())
    for rnd in range(1, rounds + 1):
        task_seed = derive_seed(seed, rnd, 0, "client")
        batches = EpochBatches(
            data.clients[0].train, local.batch_size, torch_generator(task_seed, purpose="batches"), epochs=local.epochs
        )
        for _ in range(local.epochs):
            for x, y in batches.epoch():
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
    return model.state_dict()


def one_client_data() -> GaussianFeatures:
    return GaussianFeatures(
        dim=6, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=50, test_per_domain=30
    )


def test_fedavg_with_one_client_equals_plain_local_training(tmp_path):
    local = LocalTraining(epochs=3, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-4)
    fed = head_federation(tmp_path, data=one_client_data(), rounds=1, local=local)
    fed.fit()
    federated = load_checkpoint(tmp_path).global_weights
    plain = plain_local_training(fed, local, fed.seed, rounds=1)
    for name in plain:
        torch.testing.assert_close(federated[name], plain[name], rtol=0, atol=0)


def test_fedavg_rounds_without_momentum_equal_continuous_training(tmp_path):
    """With plain SGD (no optimiser state), R rounds of 1-client FedAvg are R×E epochs of local training."""
    local = LocalTraining(epochs=2, batch_size=8, lr=0.1, momentum=0.0, weight_decay=0.0)
    fed = head_federation(tmp_path, data=one_client_data(), rounds=3, local=local)
    fed.fit()
    federated = load_checkpoint(tmp_path).global_weights
    plain = plain_local_training(fed, local, fed.seed, rounds=3)
    for name in plain:
        torch.testing.assert_close(federated[name], plain[name], rtol=0, atol=0)


def test_weighted_average_matches_hand_computation():
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(5)}
    b = {"w": torch.tensor([4.0, -1.0]), "steps": torch.tensor(9)}
    out = weighted_average([a, b], [10, 30])
    # (10*[1,2] + 30*[4,-1]) / 40 = [3.25, -0.25]
    assert torch.equal(out["w"], torch.tensor([3.25, -0.25]))
    assert int(out["steps"]) == 5  # integer buffers are not averaged
    with pytest.raises(ValueError, match="sum to a positive"):
        weighted_average([a, b], [0, 0])


def test_fedavg_sample_and_uniform_weighting():
    results = [
        ClientResult(client_id=0, num_samples=1, weights={"w": torch.tensor([0.0])}),
        ClientResult(client_id=1, num_samples=3, weights={"w": torch.tensor([4.0])}),
    ]
    by_samples, _ = FedAvg().aggregate(1, {}, results, {})
    uniform, _ = FedAvg(weighting="uniform").aggregate(1, {}, results, {})
    assert float(by_samples["w"]) == 3.0  # (1*0 + 3*4) / 4
    assert float(uniform["w"]) == 2.0


def test_global_model_is_the_weighted_average_of_client_models(tmp_path):
    """One round through the real loop: the checkpointed global model is Σ n_k w_k / Σ n_k of the client fits."""
    captured: list[ClientResult] = []

    class Recording(SerialExecutor):
        def run(self, tasks):
            results = super().run(tasks)
            captured.extend(copy.deepcopy(results))
            return results

    data = GaussianFeatures(
        dim=5, num_classes=3, num_domains=1, clients_per_domain=3, samples_per_client=40, test_per_domain=20
    )
    fed = head_federation(tmp_path, data=data, rounds=1, executor=Recording())
    fed.fit()
    assert len(captured) == 3
    sizes = [r.num_samples for r in captured]
    expected = {
        k: sum(r.weights[k].double() * n for r, n in zip(captured, sizes)) / sum(sizes) for k in captured[0].weights
    }
    got = load_checkpoint(tmp_path).global_weights
    for k in expected:
        torch.testing.assert_close(got[k].double(), expected[k], rtol=0, atol=1e-7)
    # the clients really trained differently
    assert not torch.equal(captured[0].weights["1.weight"], captured[1].weights["1.weight"])


@pytest.mark.parametrize("make", [head_federation, cnn_federation])
def test_identical_reruns_give_identical_metrics_files(tmp_path, make):
    make(tmp_path / "a").fit()
    make(tmp_path / "b").fit()
    a = (tmp_path / "a" / "metrics.jsonl").read_bytes()
    assert a == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    assert a.count(b"\n") == 3


def test_different_seeds_differ(tmp_path):
    head_federation(tmp_path / "a", seed=1).fit()
    head_federation(tmp_path / "b", seed=2).fit()
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() != (tmp_path / "b" / "metrics.jsonl").read_bytes()


class CrashAtRound(SerialExecutor):
    """Simulates a kill: raises when asked to run round `crash_round`."""

    def __init__(self, crash_round: int) -> None:
        super().__init__()
        self.crash_round = crash_round

    def run(self, tasks):
        if tasks[0].round == self.crash_round:
            raise KeyboardInterrupt("simulated kill")
        return super().run(tasks)


@pytest.mark.parametrize("make", [head_federation, cnn_federation])
def test_resume_after_kill_equals_uninterrupted_run(tmp_path, make):
    sampling = ClientSampling(fraction=0.5)  # also checks that client sampling resumes on the same stream
    make(tmp_path / "full", rounds=5, sampling=sampling).fit()
    with pytest.raises(KeyboardInterrupt):
        make(tmp_path / "killed", rounds=5, sampling=sampling, executor=CrashAtRound(4)).fit()
    assert load_checkpoint(tmp_path / "killed").round == 3
    make(None, rounds=5, sampling=sampling).fit(resume=tmp_path / "killed")
    full = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == full
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "killed")
    for k in a.global_weights:
        assert torch.equal(a.global_weights[k], b.global_weights[k])


def test_interrupt_writes_the_last_completed_round_even_between_checkpoints(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        head_federation(tmp_path / "killed", rounds=5, checkpoint_every=10, executor=CrashAtRound(4)).fit()
    assert load_checkpoint(tmp_path / "killed").round == 3
    head_federation(None, rounds=5).fit(resume=tmp_path / "killed")
    head_federation(tmp_path / "full", rounds=5).fit()
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


class FlakyExecutor(SerialExecutor):
    """Client `client` raises on its first `failures` attempts in round `round` (a worker hiccup)."""

    def __init__(self, client: int, failures: int, round: int = 2, max_retries: int = 1) -> None:
        super().__init__(max_retries=max_retries)
        self.client, self.failures, self.round, self.calls = client, failures, round, 0

    def start(self, env):
        super().start(env)
        import flsuite.federation.executors as ex

        real = ex.run_client

        def flaky(env, task):
            if task.client_id == self.client and task.round == self.round and self.calls < self.failures:
                self.calls += 1
                raise RuntimeError("simulated client crash")
            return real(env, task)

        self._patch = (ex, real)
        ex.run_client = flaky

    def close(self):
        ex, real = self._patch
        ex.run_client = real


def test_a_client_failing_once_is_retried_and_the_run_is_unchanged(tmp_path):
    head_federation(tmp_path / "clean").fit()
    head_federation(tmp_path / "flaky", executor=FlakyExecutor(client=1, failures=1)).fit()
    assert (tmp_path / "flaky" / "metrics.jsonl").read_text() == (tmp_path / "clean" / "metrics.jsonl").read_text()


def test_a_client_that_always_fails_stops_the_run_or_is_dropped_and_recorded(tmp_path):
    from flsuite.federation.phases import ClientFailedError

    with pytest.raises(ClientFailedError, match=r"client\(s\) \[1\] failed after 2 attempt"):
        head_federation(tmp_path / "fail", executor=FlakyExecutor(client=1, failures=99)).fit()
    head_federation(tmp_path / "drop", executor=FlakyExecutor(client=1, failures=99), on_client_failure="drop").fit()
    import json

    records = [json.loads(line) for line in (tmp_path / "drop" / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients_failed"] for r in records] == [[], [1], []]


def test_non_finite_updates_are_rejected_and_recorded(tmp_path):
    import json

    from tests.helpers import ExplodingFedAvg

    head_federation(tmp_path, method=ExplodingFedAvg()).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients_rejected"] for r in records] == [[], [0], []]
    assert all(torch.isfinite(w).all() for w in load_checkpoint(tmp_path).global_weights.values())


def test_resume_from_a_missing_folder_names_it(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint found"):
        head_federation(tmp_path).fit(resume=tmp_path / "nowhere")


def test_client_sampling_is_seeded_per_round():
    s = ClientSampling(fraction=0.3)
    assert s.sample(10, seed=0, round=1) == s.sample(10, seed=0, round=1)
    assert len(s.sample(10, seed=0, round=1)) == 3
    draws = {tuple(s.sample(10, seed=0, round=r)) for r in range(1, 20)}
    assert len(draws) > 5
    assert ClientSampling(per_round=4).sample(10, 0, 1) != ClientSampling(per_round=4).sample(10, 1, 1)


def test_run_folder_contents(tmp_path):
    summary = head_federation(tmp_path, rounds=6, target_acc=1.0).fit()
    for name in (
        "metrics.jsonl",
        "timings.jsonl",
        "partition.json",
        "partition.png",
        "summary.json",
        "results.md",
        "convergence.png",
    ):
        assert (tmp_path / name).is_file(), name
    import json

    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    accs = [r["acc_mean"] for r in history]
    assert summary["last5/acc_mean"] == pytest.approx(sum(accs[-5:]) / 5)
    assert summary["best/acc_mean"] == max(accs)
    assert summary["rounds_to_target"] == 1
    assert history[0]["bytes_down"] == history[0]["bytes_up"] == 4 * (8 * 3 + 3) * 4  # 4 clients × Linear(8, 3) float32
