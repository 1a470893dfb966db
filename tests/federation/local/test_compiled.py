"""`local.loop: compiled` (flsuite.federation.local.compiled): the lean loop's training with forward and backward
compiled.

Not the lean loop's bits (inductor fuses kernels, the update is torch's fused SGD), so the checks are closeness to the
lean loop, determinism of its own, the lean loop's semantics where they are not about rounding (parameters the loss
does not reach, hooks reading `.grad`), and a clear error for a loss dynamo cannot capture.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
import torch

from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.local import compiled, scan_steps
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import ClientModule, HyperParameters
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedgen import FedGen
from flsuite.methods.fedntd import FedNTD
from flsuite.methods.fedproc import FedProc
from flsuite.methods.fedproto import FedProto
from flsuite.methods.fedprox import FedProx, FedProxClient, FedProxClientSettings
from flsuite.methods.fedsr import FedSR, FedSRModel
from flsuite.methods.fpl import FPL
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import MLP, Linear
from tests.helpers import head_federation

DATA = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=44)
#: DATA's clients with 40 samples: 5 equal batches of 8 an epoch (DATA's have a smaller last batch of 4)
EQUAL = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=40)


def local(loop: str, **kwargs) -> LocalTraining:
    return LocalTraining(
        **{"epochs": 3, "batch_size": 4, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3, "loop": loop, **kwargs}
    )


def federation(run_dir, loop: str, **overrides):
    """A run over the clients of `fits` (DATA, the same linear model, batch 8: five full batches and one of 4 an epoch):
    its graphs have the shapes of `fits`'s, so inductor's kernel cache (shared by the processes of a test session)
    compiles their kernels once."""
    return head_federation(
        run_dir, **{"data": DATA, "model": Linear(), "local": local(loop, batch_size=8), **overrides}
    )


def client_fits(loop: str, method=None, model=None, data=DATA, **kwargs) -> list:
    """Two clients' fits of `data` from the same global weights; by default an MLP at batch 4 (DATA's 44 samples: 11
    equal batches), as tests/methods use it; the tests here go through `fits`."""
    data = data.build(seed=1)
    env = ClientEnvironment(
        data, model or MLP(hidden=(5,)), HyperParameters(method or FedAvg()), local(loop, **kwargs), seed=0
    )
    torch.manual_seed(0)
    weights = env.build_model().state_dict()
    return [run_client(env, ClientTask(1, k, 10 + k, weights)) for k in range(2)]


def fits(loop: str, **kwargs) -> list:
    """`client_fits` of `federation`'s linear model at its batch of 8 (44 samples: 5 full batches and one of 4 an
    epoch), the batch of every compiled fit here: a graph's kernels are specialised to its shapes and shared by graphs
    that have the same ones, and each operation of the loss is more kernels to compile (a linear model is the fewest:
    the methods that read features, a hidden layer's, pass `model=MLP(...)`)."""
    return client_fits(loop, **{"batch_size": 8, "model": Linear(), **kwargs})


@pytest.mark.parametrize(("data", "steps"), [(EQUAL, 15), (DATA, 18)], ids=["equal batches", "a smaller last batch"])
def test_a_compiled_fit_is_the_lean_fit_up_to_rounding(data, steps):
    lean, fast = fits("lean", data=data), fits("compiled", data=data)
    for a, b in zip(lean, fast):
        assert a.num_steps == b.num_steps == steps
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5)
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)
    assert not torch.equal(fast[0].weights["1.weight"], fast[1].weights["1.weight"])  # two clients, two fits


class CrossEntropyOf(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return torch.nn.functional.cross_entropy(self.model(x), y), {}  # what `_LocalLoss` returns: (loss, statistics)


def scanned_calls(monkeypatch) -> list[int]:
    """The lengths of the runs of full batches every fit from here on tries to scan (a failed try included)."""
    calls, scan = [], compiled.CompiledSteps._scan
    monkeypatch.setattr(
        compiled.CompiledSteps,
        "_scan",
        lambda self, batches, start, stop: calls.append(stop - start) or scan(self, batches, start, stop),
    )
    return calls


@pytest.mark.parametrize(("data", "steps"), [(EQUAL, 15), (DATA, 18)], ids=["equal batches", "a smaller last batch"])
def test_runs_of_full_batches_are_one_scanned_call_each(monkeypatch, data, steps):
    """FedAvg with SGD: nothing runs between two steps, so after the fit's first (eager) step each epoch's full
    batches are one call (40 samples: 5 batches of 8; 44: 5 of 8 and a last one of 4, which runs eagerly)."""
    calls = scanned_calls(monkeypatch)
    done = fits("compiled", data=data)
    assert calls == [4, 5, 5] * 2  # two clients
    assert [fit.num_steps for fit in done] == [steps, steps]


def test_a_streamed_epoch_is_gathered_inside_the_scan_and_trains_the_lean_head_to_rounding(monkeypatch):
    """A server fit on `EpochBatches(reuse=True)` under the compiled loop (FKPL's head): each run of full batches is
    scanned from its rows, gathered inside the scan (no epoch stacked or read batch by batch); only the eager steps
    read their batch. The head is the lean fit's up to rounding. (Not compared with a compiled fit on fresh gathers:
    that would compile a second graph, ~3 s of the suite; they were the same bit for bit when measured.)"""
    from flsuite.data.base import EpochBatches, StreamedEpoch
    from flsuite.federation.server import RoundServer

    split = DATA.build(seed=1).clients[0].train  # 44 samples: 5 full batches of 8 and one of 4 an epoch
    server = RoundServer(round=1, seed=0, results=[], num_clients=1, build_model=lambda: None)
    reads, read = [], StreamedEpoch.__getitem__
    monkeypatch.setattr(StreamedEpoch, "__getitem__", lambda self, i: reads.append(i) or read(self, i))

    def head(loop: str, reuse: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(3)
        model = Linear().build(tuple(split.x.shape[1:]), 3)
        batches = EpochBatches(split, 8, torch.Generator().manual_seed(1), epochs=3, reuse=reuse)
        server.train(model, batches, local(loop, batch_size=8, weight_decay=0.0), "head")
        return model.state_dict()

    calls = scanned_calls(monkeypatch)
    streamed = head("compiled", reuse=True)
    assert calls == [4, 5, 5]
    assert reads == [0, 0, 5, 5, 5]  # the probe and the first step, then each epoch's smaller last batch
    lean = head("lean", reuse=True)
    for k in lean:
        torch.testing.assert_close(streamed[k], lean[k], rtol=1e-5, atol=1e-6)


def test_a_fixed_number_of_steps_across_passes_is_the_lean_fit_up_to_rounding(monkeypatch):
    """`local.steps`: 14 batches of 8 over 44 samples cross passes (5 full + 1 of 4 per pass): runs of full batches
    from two passes are stacked by copy, and the smaller batches run eagerly between them."""
    calls = scanned_calls(monkeypatch)
    lean, fast = fits("lean", steps=14), fits("compiled", steps=14)
    assert calls == [4, 5, 2] * 2
    for a, b in zip(lean, fast):
        assert a.num_steps == b.num_steps == 14
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)


class ClippingClient(ClientModule):
    step_hooks = True

    def before_optimizer_step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=0.05)


class ClippedFedAvg(FedAvg):
    client_module = ClippingClient


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [(ClippedFedAvg(), {}), (FedAvg(), {"optimizer": "adam", "lr": 0.01})],
    ids=["a before_optimizer_step hook", "Adam"],
)
def test_hooks_or_another_optimiser_keep_one_compiled_call_per_batch(monkeypatch, method, kwargs):
    """Method code between two steps (here gradient clipping), or an optimiser other than plain SGD: each batch is
    one compiled forward-and-backward, the hook and the optimiser's step run between them, as in the lean loop."""
    calls = scanned_calls(monkeypatch)
    lean, fast = fits("lean", method=method, **kwargs), fits("compiled", method=method, **kwargs)
    assert calls == []
    for a, b in zip(lean, fast):
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_gradient_offset_is_folded_into_the_scanned_steps(monkeypatch):
    """SCAFFOLD's correction c − c_k is a `gradient_offset`: its fits scan, and train as the lean loop does (with
    nonzero control variates from round 2 on: tested over rounds below)."""
    calls = scanned_calls(monkeypatch)
    offset = {"1.bias": torch.tensor([0.5, -0.5, 0.0])}  # for one of the two parameters
    monkeypatch.setattr(ClientModule, "gradient_offset", lambda self: offset)
    lean, fast = fits("lean"), fits("compiled")
    assert calls == [4, 5, 5] * 2
    for a, b in zip(lean, fast):
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(ClientModule, "gradient_offset", lambda self: {})
    plain = fits("lean")
    assert not torch.equal(plain[0].weights["1.bias"], lean[0].weights["1.bias"])  # the offset moved the weights


class MaskIndexingClient(ClientModule):
    """Cross-entropy plus a penalty on the logits of the wrong classes, picked by boolean-mask indexing."""

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        wrong = logits[torch.ones_like(logits, dtype=torch.bool).scatter_(1, y[:, None], False)]
        return torch.nn.functional.cross_entropy(logits, y) + 0.1 * wrong.pow(2).mean()


class MaskIndexingMethod(FedAvg):
    client_module = MaskIndexingClient


@pytest.mark.slow
def test_a_loss_that_cannot_be_scanned_steps_one_call_per_batch(monkeypatch, caplog):
    """Boolean-mask indexing gives a shape that depends on the data: dynamo captures it for one batch but not inside
    a scan. The fit goes on one compiled call per batch, says so once, and trains as the lean loop does; later fits
    of the layout do not try again."""
    tried = scanned_calls(monkeypatch)  # attempts, the failed one included
    monkeypatch.setattr(compiled, "_UNSCANNED", set())  # as in a new process
    lean = fits("lean", method=MaskIndexingMethod())
    with caplog.at_level("WARNING", logger="flsuite.federation.local.compiled"):
        fast = fits("compiled", method=MaskIndexingMethod())
    assert tried == [4]  # the first try; the second client does not scan
    warnings = [r.getMessage() for r in caplog.records if "could not be scanned" in r.getMessage()]
    assert len(warnings) == 1 and "MaskIndexingClient" in warnings[0]
    for a, b in zip(lean, fast):
        assert a.num_steps == b.num_steps == 18
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fedntd_scans(monkeypatch):
    """FedNTD picks the not-true logits by a gather (static shapes), so its fits scan and match the lean loop."""
    calls = scanned_calls(monkeypatch)
    lean, fast = fits("lean", method=FedNTD(), data=EQUAL), fits("compiled", method=FedNTD(), data=EQUAL)
    assert calls == [4, 5, 5] * 2  # the first epoch's first step eager, then every batch of 8 scanned
    for a, b in zip(lean, fast):
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "rule",
    [
        {"momentum": 0.9, "weight_decay": 1e-2},
        {"momentum": 0.9, "dampening": 0.3},
        {"momentum": 0.8, "nesterov": True, "weight_decay": 1e-3},
        {"momentum": 0.0, "weight_decay": 1e-2},
        {"momentum": 0.5, "maximize": True},
    ],
    ids=["momentum+decay", "dampening", "nesterov", "no momentum", "maximize"],
)
def test_scanned_steps_follow_torch_sgd(rule):
    """`_sgd_steps` (eager scan) against torch.optim.SGD with a gradient offset added after backward, after a first
    torch step that creates the buffers."""
    torch.manual_seed(0)
    loss_module = CrossEntropyOf(Linear().build((6,), 3))
    xs, ys = torch.randn(5, 4, 6), torch.randint(0, 3, (5, 4))
    optimizer = torch.optim.SGD(loss_module.parameters(), lr=0.1, **rule)

    offsets = {"model.1.bias": torch.tensor([0.2, -0.1, 0.0])}  # a gradient offset, as SCAFFOLD's (the weight: none)

    def step(x, y):
        optimizer.zero_grad()
        loss, _ = loss_module(x, y)
        loss.backward()
        loss_module.model[1].bias.grad.add_(offsets["model.1.bias"])
        optimizer.step()
        return loss.detach()

    step(xs[0], ys[0])
    named = dict(loss_module.named_parameters())
    params = {n: p.detach().clone() for n, p in named.items()}
    momentum = rule.get("momentum", 0.0)
    buffers = {n: optimizer.state[p]["momentum_buffer"].clone() for n, p in named.items()} if momentum else {}
    spec = (
        momentum,
        rule.get("dampening", 0.0),
        rule.get("weight_decay", 0.0),
        rule.get("nesterov", False),
        rule.get("maximize", False),
    )
    new, new_buffers, grads, losses, _ = scan_steps._sgd_steps(
        loss_module, params, buffers, offsets, torch.tensor(0.1), spec, xs[1:], ys[1:]
    )
    torch.testing.assert_close(losses, torch.stack([step(x, y) for x, y in zip(xs[1:], ys[1:])]))
    for n, p in named.items():
        torch.testing.assert_close(new[n], p.detach())
        torch.testing.assert_close(grads[n], p.grad)
        if momentum:
            torch.testing.assert_close(new_buffers[n], optimizer.state[p]["momentum_buffer"])
    assert not torch.equal(new["model.1.weight"], params["model.1.weight"])


def test_consecutive_batches_are_stacked_as_a_view_of_their_epoch():
    epoch = torch.arange(40.0).reshape(10, 4)
    batches = list(epoch.split(3))
    view = scan_steps.stacked(batches[:3])
    assert view.data_ptr() == epoch.data_ptr() and torch.equal(view, torch.stack(batches[:3]))
    later = scan_steps.stacked(batches[1:3])  # not at the start of its storage: a copy
    assert (
        later.data_ptr() != epoch.data_ptr()
        and later.storage_offset() == 0
        and torch.equal(later, torch.stack(batches[1:3]))
    )
    apart = [torch.ones(3, 4), torch.zeros(3, 4)]
    assert torch.equal(scan_steps.stacked(apart), torch.stack(apart))


def test_compiled_fits_repeat_to_the_bit():
    first, second = fits("compiled"), fits("compiled")
    for a, b in zip(first, second):
        assert a.train_loss == b.train_loss
        assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_adam_trains_as_in_the_lean_loop(monkeypatch):
    """Adam has no fused path here: the compiled loop's gradients go through Adam's own step(), as in the lean loop."""
    steps = []
    adam_step = torch.optim.Adam.step
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, *a, **k: steps.append(1) or adam_step(self, *a, **k))
    lean, fast = fits("lean", optimizer="adam", lr=0.01), fits("compiled", optimizer="adam", lr=0.01)
    assert len(steps) == 4 * 18  # two loops x two clients x 18 steps
    for a, b in zip(lean, fast):
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "method", [Scaffold(), FedProx(mu=0.5)], ids=["scaffold (gradient offset)", "fedprox (loss term)"]
)
@pytest.mark.slow
def test_method_hooks_and_loss_terms_work_as_in_the_lean_loop(tmp_path, method):
    """SCAFFOLD offsets the gradients by its control variates, FedProx reads its anchor and μ (through the read-only
    hyperparameters) inside the loss: three rounds agree with the lean loop's to rounding."""
    runs = {}
    for loop in ("lean", "compiled"):
        federation(tmp_path / loop, loop, rounds=3, method=method).fit()
        runs[loop] = load_checkpoint(tmp_path / loop).global_weights
    for k in runs["lean"]:
        torch.testing.assert_close(runs["compiled"][k], runs["lean"][k], rtol=1e-4, atol=1e-5)


def test_a_parameter_the_loss_does_not_reach_is_left_alone():
    """FedSR without its CMI term never uses the model's reference Gaussians (r_mu, r_sigma, C). After backward()
    their .grad is None, so SGD leaves them alone; a compiled gradient would be zero, and weight decay would move
    them. The compiled loop differentiates only what the first (eager) step reached."""
    done = fits(
        "compiled", method=FedSR(cmi=0.0, reference="averaged"), model=FedSRModel(hidden=[8], dim=4)
    )  # r_mu etc. in the upload
    for fit in done:
        assert torch.equal(fit.weights["r_mu"], torch.zeros(3, 4))
        assert torch.equal(fit.weights["r_sigma"], torch.ones(3, 4))
        assert torch.equal(fit.weights["C"], torch.ones(()))


class Renamed(torch.nn.Module):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RenamedLinear(Linear):
    """`Linear`'s model with other parameter names ("net.1.weight", ...): another layout, the same shapes."""

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
        return Renamed(super().build(input_shape, num_classes))


@torch._dynamo.config.patch(recompile_limit=1)
@pytest.mark.slow
def test_each_client_class_compiles_on_its_own_budget():
    """Graphs are kept per client class and parameter layout, for full batches only: with dynamo allowed one graph
    per code object, FedAvg and FedProx clients (two classes) and a second model (another layout: other parameter
    names, the same shapes, so inductor's kernel cache serves its kernels) compile in one process; runs of 4 and 5
    full batches (the first epoch and the others) share one scanned graph, and an epoch's smaller last batch (44
    samples at batch 8) needs no second graph."""
    torch._dynamo.reset()  # as in a new process: earlier tests compiled these layouts at other batch sizes and
    scan_steps.compiled_sgd_steps.cache_clear()  # thread counts (a guard), and would need a second graph here
    compiled.compiled_loss_and_grads.cache_clear()
    fits("compiled")
    fits("compiled", method=FedProx(mu=0.5))
    done = fits("compiled", model=RenamedLinear())
    assert "net.1.weight" in done[0].weights


@torch._dynamo.config.patch(recompile_limit=1)
@pytest.mark.slow
def test_a_learning_rate_schedule_needs_no_new_graph(tmp_path, monkeypatch):
    """The scanned steps take the group's lr as a tensor, read at every call: a schedule over rounds (0.1 in round 1,
    0.01 from round 2) trains as the lean loop does, with one graph (a constant lr would need one per value)."""
    torch._dynamo.reset()
    scan_steps.compiled_sgd_steps.cache_clear()
    compiled.compiled_loss_and_grads.cache_clear()
    calls = scanned_calls(monkeypatch)
    runs = {}
    for loop in ("lean", "compiled"):
        federation(tmp_path / loop, loop, rounds=3, local=local(loop, batch_size=8, lr_milestones=[2])).fit()
        runs[loop] = load_checkpoint(tmp_path / loop).global_weights
    assert len(calls) == 3 * 2 * 3  # rounds x clients x epochs: every epoch scanned
    for k in runs["lean"]:
        torch.testing.assert_close(runs["compiled"][k], runs["lean"][k], rtol=1e-4, atol=1e-5)


class CountsInPlace(ClientModule):
    """The pattern `ClientModule.gather` replaces: a statistic accumulated in place inside the loss."""

    def begin(self) -> None:
        self.seen = torch.zeros(3, dtype=torch.long)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.seen += torch.bincount(y, minlength=3)
        return torch.nn.functional.cross_entropy(self.model(x), y)


class CountingInPlace(FedAvg):
    client_module = CountsInPlace


def test_a_loss_dynamo_cannot_capture_fails_with_a_clear_error():
    """An in-place update of a captured tensor inside the loss is not expressible under a grad transform."""
    with pytest.raises(
        RuntimeError, match=r"local.loop: compiled could not compile CountsInPlace.local_loss.*Use local.loop: lean"
    ):
        fits("compiled", method=CountingInPlace())


@pytest.mark.parametrize("method", [FedProto, FedProc, FPL, FedGen], ids=lambda m: m.__name__)
def test_methods_that_gather_statistics_scan_and_upload_what_the_lean_fit_does(monkeypatch, method):
    """Their statistics (prototype sums, label counts) leave the loss as an auxiliary output and are gathered
    step by step outside it: the runs of full batches are scanned as FedAvg's are, and the uploads (counts to the
    bit, prototypes up to rounding) are the lean fit's."""
    lean = fits("lean", method=method(), model=MLP(hidden=(5,)))  # features: the hidden layer's
    calls = scanned_calls(monkeypatch)
    fast = fits("compiled", method=method(), model=MLP(hidden=(5,)))
    assert calls == [4, 5, 5] * 2
    for a, b in zip(lean, fast):
        assert a.upload and a.upload.keys() == b.upload.keys()
        for k in a.upload:
            if a.upload[k].is_floating_point():
                torch.testing.assert_close(b.upload[k], a.upload[k], rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(b.upload[k], a.upload[k]), k


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loop": "jit"}, "local.loop must be 'auto', 'lean', 'standard' or 'compiled', got 'jit'"),
        ({"loop": "compiled", "precision": "16-mixed"}, "needs local.loop: standard"),
    ],
)
def test_bad_loop_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalTraining(**kwargs)


def test_read_only_hyperparameters_pickle_and_refuse_writes():
    """What clients get of a method survives pickling (Ray), refuses writes, and its settings are a frozen dataclass:
    `client_settings` returning anything else is refused when the phase starts."""
    hp = pickle.loads(pickle.dumps(HyperParameters(FedProx(mu=0.25))))
    assert hp.settings == FedProxClientSettings(mu=0.25) and hp.client_module is FedProxClient
    with pytest.raises(AttributeError, match="read-only"):
        hp.settings = FedProxClientSettings(mu=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hp.settings.mu = 1.0  # type: ignore[misc]

    class Loose(FedProx):
        def client_settings(self):
            return {"mu": self.mu}

    with pytest.raises(TypeError, match=r"Loose.client_settings\(\) must return a frozen dataclass instance, got dict"):
        HyperParameters(Loose())


def test_layouts_key_the_compiled_functions():
    a = compiled.compiled_loss_and_grads((FedAvg, (("w", torch.Size([2]), torch.float32, torch.device("cpu")),)))
    b = compiled.compiled_loss_and_grads((FedAvg, (("w", torch.Size([2]), torch.float32, torch.device("cpu")),)))
    c = compiled.compiled_loss_and_grads((FedProx, (("w", torch.Size([2]), torch.float32, torch.device("cpu")),)))
    assert a is b and a is not c


@pytest.mark.slow
def test_serial_and_ray_compiled_runs_are_the_same_to_the_bit(tmp_path, local_ray):
    """A Ray worker compiles its own graphs; they compute what the driver's compile computes. One worker (it fits the
    two clients in turn, the later one on its graphs): a second would compile the same graphs again, and Ray's
    results from several workers are compared with the serial ones in tests/federation/test_ray_executor.py. The
    driver's graphs are those of `test_method_hooks_and_loss_terms_work_as_in_the_lean_loop[fedprox (loss term)]`
    (same client class and layout), compiled once in a process that runs both."""
    from flsuite.federation.ray_executor import RayExecutor

    kwargs = {"rounds": 2, "method": FedProx(mu=0.5)}
    federation(tmp_path / "serial", "compiled", **kwargs).fit()
    federation(tmp_path / "ray", "compiled", executor=RayExecutor(num_workers=1, keep_workers=True), **kwargs).fit()
    assert (tmp_path / "serial" / "metrics.jsonl").read_text() == (tmp_path / "ray" / "metrics.jsonl").read_text()
    serial, ray = load_checkpoint(tmp_path / "serial").global_weights, load_checkpoint(tmp_path / "ray").global_weights
    assert all(torch.equal(serial[k], ray[k]) for k in serial)


@torch._dynamo.config.patch(recompile_limit=2)
@pytest.mark.slow
def test_fedgens_round_decayed_weights_need_no_graph_per_round(tmp_path):
    """FedGen's α_t = α·γ^(t−1) and β_t change every round: the compiled loss reads them as tensors, so rounds 2-6
    (the generator broadcast) share one graph beside round 1's (no generator), within dynamo's limit of two. As Python
    floats they were graph constants: a graph a round, and the run failed at the limit. (Its generator draws make the
    compiled run another sample of the lean one, not its copy to rounding.)"""
    torch._dynamo.reset()
    scan_steps.compiled_sgd_steps.cache_clear()
    compiled.compiled_loss_and_grads.cache_clear()
    federation(tmp_path, "compiled", rounds=6, method=FedGen(alpha=2.0, beta=3.0, decay=0.5)).fit()
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds if "round" in r][-1] == 6
