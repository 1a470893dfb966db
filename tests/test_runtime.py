"""The thread policy: its decisions (the work per step, config, environment override, division of cores among parallel
processes), the FLOPs it decides by, what a run applies and records, and a study with two workers dividing the cores."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from flsuite.runtime import FLOPS_PER_THREAD, PARALLEL_ENV, THREADS_ENV, ThreadPolicy, step_flops, thread_counts

ROOT = Path(__file__).resolve().parents[1]
#: Forward FLOPs of a training batch: a head on embeddings (Linear 1280 -> 10 at batch 16) and a ResNet at 32 px.
SMALL, LARGE = 2 * 1280 * 10 * 16, 64 * FLOPS_PER_THREAD


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No thread settings from the caller's environment, and torch's count restored after each test."""
    for name in (THREADS_ENV, PARALLEL_ENV, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_gives_a_thread_per_share_of_work_and_leaves_one_core_to_the_machine():
    auto = ThreadPolicy()
    assert auto.resolve(SMALL, cores=8)["intra_op"] == 1
    assert auto.resolve(SMALL, cores=1)["intra_op"] == 1
    assert auto.resolve(FLOPS_PER_THREAD - 1, cores=8)["intra_op"] == 1
    assert auto.resolve(2 * FLOPS_PER_THREAD, cores=8)["intra_op"] == 2
    assert auto.resolve(3 * FLOPS_PER_THREAD - 1, cores=8)["intra_op"] == 2
    assert auto.resolve(LARGE, cores=8)["intra_op"] == 7  # one core left to the rest of the machine
    assert auto.resolve(LARGE, cores=8, spare=0)["intra_op"] == 8
    assert auto.resolve(LARGE, cores=2)["intra_op"] == 1
    assert auto.resolve(LARGE, cores=1)["intra_op"] == 1
    assert (
        auto.resolve(LARGE, cores=8)["source"]
        == f"auto ({LARGE / 1e9:.3g} GFLOP per step, 8 cores, 1 spare, 1 parallel)"
    )
    assert auto.resolve(LARGE, cores=8)["inter_op"] == 1


def test_step_flops_counts_the_forward_pass_of_a_batch_and_leaves_the_model_and_rng_alone():
    from flsuite.models.heads import Linear, SmallCNN

    head = Linear().build((1280,), 10)
    head.train()
    state = torch.random.get_rng_state()
    assert step_flops(head, (1280,), 16) == SMALL  # a matmul of 1280 x 10 per sample: 2 * 1280 * 10 FLOPs
    assert head.training and torch.equal(torch.random.get_rng_state(), state)
    cnn = SmallCNN(channels=[16, 32], hidden=64).build((1, 8, 8), 10)  # the quickstart's model and batch
    assert step_flops(cnn, (1, 8, 8), 32) == 2 * step_flops(cnn, (1, 8, 8), 16)
    assert ThreadPolicy().resolve(step_flops(cnn, (1, 8, 8), 16), cores=64)["intra_op"] == 1


@pytest.mark.parametrize(("parallel", "expected"), [("1", 7), ("2", 3), ("3", 2), ("8", 1), ("16", 1)])
def test_auto_divides_the_cores_among_parallel_processes(monkeypatch, parallel, expected):
    monkeypatch.setenv(PARALLEL_ENV, parallel)
    assert ThreadPolicy().resolve(LARGE, cores=8)["intra_op"] == expected
    assert ThreadPolicy().resolve(SMALL, cores=8)["intra_op"] == 1


def test_auto_uses_the_process_affinity_by_default():
    cores = len(os.sched_getaffinity(0))
    assert ThreadPolicy().resolve(LARGE)["intra_op"] == max(1, cores - 1)


def test_config_count_is_used_as_is():
    assert ThreadPolicy(intra_op=3).resolve(SMALL, cores=2) == {"intra_op": 3, "inter_op": 1, "source": "config"}
    assert ThreadPolicy(intra_op=1, inter_op=2).resolve(LARGE, cores=8)["inter_op"] == 2


def test_environment_variable_overrides_config_and_auto(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "2")
    monkeypatch.setenv(PARALLEL_ENV, "4")
    assert ThreadPolicy(intra_op=5).resolve(LARGE, cores=8) == {"intra_op": 2, "inter_op": 1, "source": THREADS_ENV}
    assert ThreadPolicy().resolve(SMALL, cores=8)["intra_op"] == 2


def test_omp_num_threads_caps_auto_but_never_raises_it_or_a_configured_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    capped = ThreadPolicy().resolve(LARGE, cores=8)
    assert capped["intra_op"] == 2 and "OMP_NUM_THREADS=2" in capped["source"]
    assert ThreadPolicy(intra_op=4).resolve(LARGE, cores=8)["intra_op"] == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    assert ThreadPolicy().resolve(LARGE, cores=8)["intra_op"] == 7
    assert ThreadPolicy().resolve(SMALL, cores=8)["intra_op"] == 1


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True])
def test_bad_config_is_named(value):
    with pytest.raises(ValueError, match="threads.intra_op"):
        ThreadPolicy(intra_op=value)


@pytest.mark.parametrize("name", [THREADS_ENV, PARALLEL_ENV])
def test_bad_environment_value_is_named(monkeypatch, name):
    monkeypatch.setenv(name, "zero")
    with pytest.raises(ValueError, match=name):
        ThreadPolicy().resolve(LARGE, cores=2)


def test_apply_sets_torch_and_reports_the_effective_counts():
    torch.set_num_threads(2)
    applied = ThreadPolicy().apply(SMALL)
    assert torch.get_num_threads() == 1
    assert applied["intra_op"] == 1 and applied["source"].startswith("auto (0.00041 GFLOP per step")
    assert thread_counts() == applied == ThreadPolicy().describe()
    torch.set_num_threads(2)  # changed behind the policy's back: reported, without the stale reason
    assert thread_counts() == {"intra_op": 2, "inter_op": torch.get_num_interop_threads()}


def test_a_run_applies_the_policy_and_records_it(tmp_path, monkeypatch):
    from flsuite.cli import main

    torch.set_num_threads(2)
    cfg = {
        "rounds": 1,
        "seed": 0,
        "progress": False,
        "wandb": {"enabled": False},
        "run_dir": str(tmp_path / "run"),
        "data": {
            "class_path": "flsuite.data.builtin.GaussianFeatures",
            "init_args": {"dim": 8, "samples_per_client": 32},
        },
        "model": {"class_path": "flsuite.models.heads.Linear"},
        "threads": {"intra_op": 3},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["fit", "--config", str(tmp_path / "run.yaml")]) == 0
    assert torch.get_num_threads() == 3
    recorded = json.loads((tmp_path / "run" / "environment.json").read_text())["threads"]
    assert recorded["intra_op"] == 3 and recorded["source"] == "config"


def test_study_with_two_workers_gives_each_run_one_thread(tmp_path, monkeypatch):
    """A study run two at a time tells each run so (FLSUITE_PARALLEL), and each takes its share of the cores: one
    thread. Two variants of one seed, run by experiments/study.py with its `flsuite` commands in this process
    (`study_in_this_process`: what each run is told is the driver's doing; that a warm worker runs a run in the
    environment it is handed is tests/test_pool.py's test). The runs' decision reads this process's cores."""
    from tests.helpers import load_experiment, study_in_this_process

    study = load_experiment("study")
    pool = study_in_this_process(study, monkeypatch)
    cfg = {
        "name": "threads",
        "rounds": 1,
        "data": {
            "class_path": "flsuite.data.builtin.UCIDigitsDomains",
            "init_args": {"domains": ["clean"], "clients_per_domain": 1},
        },
        "model": {"class_path": "flsuite.models.heads.SmallCNN", "init_args": {"channels": [4], "hidden": 8}},
        "local": {"epochs": 1, "batch_size": 64},
    }
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(cfg))
    argv = [
        "study.py",
        "--name",
        "t",
        "--base",
        str(base),
        "--variant",
        "a=",
        "--variant",
        "b=",
        "--seeds",
        "0",
        "--workers",
        "2",
    ]
    monkeypatch.setattr(sys, "argv", [*argv, "--runs", str(tmp_path / "runs")])
    monkeypatch.chdir(tmp_path)
    study.main()
    assert pool.runs == 2
    cores = len(os.sched_getaffinity(0))
    for variant in ("a", "b"):
        threads = json.loads((tmp_path / "runs" / "t" / variant / "seed0" / "environment.json").read_text())["threads"]
        assert threads["intra_op"] == 1, threads
        assert threads["source"].endswith(f" GFLOP per step, {cores} cores, 1 spare, 2 parallel)"), threads


# ---- the frozen-feature hot path: faster, and the same numbers ----------------------------------------------------
def _tiny_client_env(samples: int = 70, epochs: int = 3, loop: str = "auto"):
    from flsuite.data.base import ClientData, FederatedData, Split
    from flsuite.federation.local.client import ClientEnvironment
    from flsuite.federation.method import HyperParameters
    from flsuite.federation.task import LocalTraining
    from flsuite.methods.fedavg import FedAvg
    from flsuite.models.heads import Linear

    g = torch.Generator().manual_seed(3)
    split = Split(torch.randn(samples, 12, generator=g), torch.randint(0, 4, (samples,), generator=g))
    fed = FederatedData([ClientData(0, "d", split)], {"d": split}, num_classes=4)
    return ClientEnvironment(
        fed,
        Linear(),
        HyperParameters(FedAvg()),
        LocalTraining(epochs=epochs, batch_size=16, lr=0.05, loop=loop),
        seed=0,
    )


@pytest.mark.parametrize("drop_last", [False, True])
def test_epoch_batches_are_contiguous_views_with_the_values_of_per_batch_indexing(drop_last):
    from flsuite.data.base import EpochBatches

    split = _tiny_client_env().data.clients[0].train
    batches = EpochBatches(split, 16, torch.Generator().manual_seed(1), drop_last=drop_last).epoch()
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(1))
    stop = 64 if drop_last else 70
    expected = [(split.x[order[i : i + 16]], split.y[order[i : i + 16]]) for i in range(0, stop, 16)]
    assert [len(y) for _, y in batches] == [len(y) for _, y in expected] == ([16] * 4 if drop_last else [16] * 4 + [6])
    for (x, y), (ex, ey) in zip(batches, expected):
        assert torch.equal(x, ex) and torch.equal(y, ey) and x.is_contiguous()


@pytest.mark.parametrize("drop_last", [False, True])
def test_streamed_epoch_batches_hold_each_batchs_fresh_values_in_one_buffer(drop_last):
    """`reuse=True` (FKPL's server head): every batch of every epoch has the values a fresh gather gives, gathered
    into the same buffer when read (so reading a batch overwrites the one before); slices and `steps` are refused."""
    from flsuite.data.base import EpochBatches, StreamedEpoch

    split = _tiny_client_env().data.clients[0].train
    fresh = EpochBatches(split, 16, torch.Generator().manual_seed(1), epochs=3, drop_last=drop_last)
    streamed = EpochBatches(split, 16, torch.Generator().manual_seed(1), epochs=3, drop_last=drop_last, reuse=True)
    pointers = set()
    for _ in range(3):
        expected, got = fresh.epoch(), streamed.epoch()
        assert isinstance(got, StreamedEpoch) and len(got) == len(expected)
        for (x, y), (ex, ey) in zip(got, expected):
            assert torch.equal(x, ex) and torch.equal(y, ey) and x.is_contiguous()
            pointers.add(x.data_ptr())
        first_x, _ = got[0]
        second_x, _ = got[1]
        assert first_x.data_ptr() == second_x.data_ptr() and torch.equal(first_x, expected[1][0])  # overwritten
    assert len(pointers) == 1
    with pytest.raises(TypeError, match="one batch at a time"):
        streamed.epoch()[0:2]
    with pytest.raises(ValueError, match="takes `epochs`, not `steps`"):
        EpochBatches(split, 16, torch.Generator(), steps=5, reuse=True)


def test_a_server_fit_streams_batches_to_the_cpu_loops_and_trains_the_same_head(monkeypatch):
    """RoundServer.train hands `reuse=True` batches to the lean and compiled loops on the CPU as streamed epochs, and
    the lean head is the fresh gathers' bit for bit; the standard loop (Lightning keeps and moves an epoch's batches)
    gets fresh gathers. The compiled loop's reading of them: tests/federation/local/test_compiled.py."""
    from flsuite.data.base import EpochBatches, StreamedEpoch
    from flsuite.federation import server as server_module
    from flsuite.federation.local.loops import ClientFit
    from flsuite.federation.server import RoundServer
    from flsuite.federation.task import LocalTraining
    from flsuite.models.heads import Linear

    split = _tiny_client_env().data.clients[0].train
    server = RoundServer(round=1, seed=0, results=[], num_clients=1, build_model=lambda: None)
    kinds: list[type] = []
    real_epoch = ClientFit.train_epoch

    def recorded(self, epoch_batches, optimizer, device):
        kinds.append(type(epoch_batches))
        return real_epoch(self, epoch_batches, optimizer, device)

    monkeypatch.setattr(ClientFit, "train_epoch", recorded)

    def train(reuse: bool, loop: str) -> dict[str, torch.Tensor]:
        local = LocalTraining(epochs=3, batch_size=16, lr=0.1, momentum=0.9, weight_decay=0.0, loop=loop)
        torch.manual_seed(3)
        model = Linear().build(tuple(split.x.shape[1:]), 10)
        batches = EpochBatches(split, 16, torch.Generator().manual_seed(1), epochs=3, reuse=reuse)
        server.train(model, batches, local, "head")
        return model.state_dict()

    streamed, fresh = train(True, "lean"), train(False, "lean")
    assert kinds == [StreamedEpoch] * 3 + [list] * 3
    assert all(torch.equal(streamed[k], fresh[k]) for k in fresh)
    handed: dict[str, type] = {}  # the stubs train nothing: what each loop was handed is checked
    monkeypatch.setattr(
        server_module, "run_fit", lambda fit, batches, *a, **k: handed.update(cpu=type(next(iter(batches))))
    )
    monkeypatch.setattr(
        RoundServer, "fit", lambda self, module, batches, purpose: handed.update(trainer=type(next(iter(batches))))
    )
    train(True, "compiled")
    train(True, "standard")
    assert handed == {"cpu": StreamedEpoch, "trainer": list}


@pytest.mark.parametrize(
    ("pays_from", "shape", "run_loop", "accelerator", "loop"),
    [
        (15, (8,), "auto", "cpu", "compiled"),
        (15, (8,), "compiled", "cpu", "compiled"),
        (16, (8,), "auto", "cpu", "lean"),
        (15, (1, 8, 8), "auto", "cpu", "lean"),
        (15, (8,), "lean", "cpu", "lean"),
        (15, (8,), "auto", "cuda", "lean"),
    ],
    ids=["enough steps", "a compiled run", "too few steps", "image inputs", "a run set to lean", "a GPU"],
)
def test_a_server_fit_on_auto_takes_the_loop_a_run_would_and_logs_a_compiled_one(
    monkeypatch, caplog, pays_from, shape, run_loop, accelerator, loop
):
    """`local.loop: auto` on a server fit is decided for that fit by the clients' rule (`choose_loop`): compiled for a
    head on feature vectors with plain SGD and at least COMPILE_PAYS_FROM_STEPS steps (here 3 epochs of 5 batches:
    15), else lean; lean in a run set to `lean` and on a GPU (as before the choice: the compiled server fit is
    measured on the CPU only); a compiled choice is logged with the fit's purpose."""
    from flsuite.data.base import EpochBatches, Split
    from flsuite.federation import server as server_module
    from flsuite.federation.local import choice
    from flsuite.federation.server import RoundServer
    from flsuite.federation.task import LocalTraining
    from flsuite.models.heads import Linear

    monkeypatch.setattr(choice, "COMPILE_PAYS_FROM_STEPS", pays_from)
    loops: list[str] = []
    monkeypatch.setattr(server_module, "run_fit", lambda fit, *a, **k: loops.append(fit.client.local.loop))
    monkeypatch.setattr(RoundServer, "fit", lambda self, module, *a, **k: loops.append(module.work.client.local.loop))
    split = Split(torch.zeros(70, *shape), torch.zeros(70, dtype=torch.long))
    server = RoundServer(0, 0, [], 1, lambda: None, accelerator=accelerator, loop=run_loop)
    local = LocalTraining(epochs=3, batch_size=16, lr=0.1, momentum=0.9, weight_decay=0.0)
    with caplog.at_level(logging.INFO, logger="flsuite.federation.server"):
        server.train(
            Linear().build(shape, 10), EpochBatches(split, 16, torch.Generator(), epochs=3, reuse=True), local, "head"
        )
    assert loops == [loop]
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    expected = "server fit head: local.loop auto -> compiled: a head on feature vectors, plain SGD, ~15 local steps"
    assert logged == ([f"{expected} per process (>= 15)"] if loop == "compiled" else [])


def test_client_fit_equals_a_hand_written_loop_bit_for_bit():
    """run_client (one Lightning fit, the lean training_step) computes exactly the textbook loop: same weights, and
    the mean loss as a float64 running sum in step order."""
    import torch.nn.functional as F

    from flsuite.data.base import EpochBatches
    from flsuite.federation.local.client import run_client
    from flsuite.federation.task import ClientTask
    from flsuite.seeding import torch_generator

    env = _tiny_client_env()
    weights = env.build_model().state_dict()
    result = run_client(env, ClientTask(1, 0, 42, weights))

    model = env.build_model()
    model.load_state_dict(weights)
    opt = env.local.make_optimizer(model.parameters())
    batches = EpochBatches(env.data.clients[0].train, 16, torch_generator(42, purpose="batches"), epochs=3)
    loss_sum, steps = torch.zeros((), dtype=torch.float64), 0
    for _ in range(3):
        for x, y in batches.epoch():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            steps += 1
    assert result.num_steps == steps == 15
    assert result.train_loss == float(loss_sum) / steps
    for name, value in model.state_dict().items():
        assert torch.equal(result.weights[name], value), name


def test_client_trainers_look_up_callback_entry_points_once_and_still_call_the_factories(monkeypatch):
    """Lightning scans the installed distributions for external-callback entry points in every Trainer; client fits
    through a Trainer (the standard loop; on the CPU the lean and compiled loops build none) do it once per process,
    and every Trainer still loads and calls what the scan found."""
    import lightning.fabric.utilities.registry as registry

    from flsuite.federation.local.client import run_client
    from flsuite.federation.task import ClientTask

    scans, calls = [], []

    class EntryPoint:  # what an installed package registers under lightning.pytorch.callbacks_factory
        name = "probe"

        def load(self):
            return lambda: calls.append(1) or []

    def scan(**selection):
        scans.append(selection)
        return [EntryPoint()]

    monkeypatch.setattr(registry, "entry_points", scan)
    env = _tiny_client_env(epochs=1, loop="standard")
    weights = env.build_model().state_dict()
    for k in range(3):
        run_client(env, ClientTask(1, 0, k, weights))
    assert scans == [{"group": "lightning.pytorch.callbacks_factory"}]
    assert len(calls) == 3


@pytest.mark.slow
def test_ray_workers_get_their_share_of_the_cpus(local_ray):
    """RayExecutor's "auto": a worker whose steps are large (a CNN at a batch of 1024: 0.66 GFLOP) uses all the
    CPUs Ray reserved for it (cpus_per_client; no spare core), a worker of a head on feature vectors one thread; an
    explicit count is used as is; a worker handed to another run (keep_workers) is set for that run's environment.
    On the process's local Ray (2 CPUs; the idle workers of earlier tests released for their CPUs): a worker of 2
    CPUs, then one of 1 CPU."""
    from flsuite.data.builtin import GaussianFeatures, UCIDigitsDomains
    from flsuite.federation import ray_workers
    from flsuite.federation.local.client import ClientEnvironment
    from flsuite.federation.method import HyperParameters
    from flsuite.federation.ray_workers import ClientWorker
    from flsuite.federation.task import LocalTraining
    from flsuite.methods.fedavg import FedAvg
    from flsuite.models.heads import Linear, SmallCNN

    class Probe(ClientWorker):
        """A worker that reports its torch threads. Workers inherit the environment of the process that started the
        local Ray, under pytest-xdist tests/conftest.py's FLSUITE_PARALLEL and OMP_NUM_THREADS (each xdist worker's
        share of the cores), which the thread policy reads (this test's `clean_env` clears them in this process only).
        A user's worker has neither: Ray sets OMP_NUM_THREADS to the CPUs it reserved when none is inherited."""

        def __init__(self, env, torch_threads) -> None:
            import ray

            for name in (THREADS_ENV, PARALLEL_ENV):
                os.environ.pop(name, None)
            os.environ["OMP_NUM_THREADS"] = str(
                max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
            )
            super().__init__(env, torch_threads)

        def threads(self) -> int:
            return torch.get_num_threads()

    big_batch = LocalTraining(batch_size=2**10)
    images = ClientEnvironment(
        UCIDigitsDomains(domains=["clean"], clients_per_domain=1).build(0),
        SmallCNN(),
        HyperParameters(FedAvg()),
        big_batch,
        0,
    )
    assert images.step_flops() >= 2 * FLOPS_PER_THREAD
    features = ClientEnvironment(
        GaussianFeatures(samples_per_client=8).build(0), Linear(), HyperParameters(FedAvg()), LocalTraining(), 0
    )
    ray = local_ray
    ray_workers.release_idle_workers()

    def threads(worker, configure=None) -> int:
        if configure is not None:
            ray.get(worker.configure.remote(*configure))
        return ray.get(worker.threads.remote())

    two = ray.remote(Probe).options(num_cpus=2).remote(features, "auto")
    try:
        assert threads(two) == 1  # a head on feature vectors: one thread
        assert threads(two, (images, "auto")) == 2  # handed to a run of large steps: both CPUs, no spare
        assert threads(two, (features, "auto")) == 1  # and back
        assert threads(two, (features, 3)) == 3  # an explicit count, as is
    finally:
        ray.kill(two, no_restart=True)
    one = ray.remote(Probe).options(num_cpus=1).remote(images, "auto")  # scheduled once the first one's CPUs are free
    try:
        assert threads(one) == 1  # large steps, one CPU reserved: one thread
    finally:
        ray.kill(one, no_restart=True)
