"""What a run prints while it works: a tqdm bar on stderr for every long phase (feature extraction, setup stages, client
queries, server-side fits, rounds) under `progress: true`, none under `progress: false`, nothing of it on stdout or in
the run folder; and no "No CUDA runtime is found" warning from the compiled loop's first compilation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from flsuite.data.base import DataSource, FederatedData, Split
from flsuite.data.builtin import GaussianFeatures
from flsuite.data.feature_cache import extract_features
from flsuite.federation.server import PublicData, ServerFinetune
from flsuite.methods.ggeur import GGEUR
from tests.data.test_feature_cache import CountingEncoder, make_images
from tests.helpers import head_federation
from tests.methods.test_fkpl import fkpl_federation

DATA = GaussianFeatures(
    dim=8, num_classes=3, num_domains=2, clients_per_domain=2, samples_per_client=60, test_per_domain=60
)
BAR = re.compile(r"\d+%\|")  # what tqdm draws, and nothing else on the console does


def bars(err: str) -> set[str]:
    """The descriptions of the bars drawn on `err` ("GGEUR", "query fkpl/virtual", ...)."""
    return {m.group(1).strip() for m in re.finditer(r"(?:^|\r|\n)([^\r\n:]+):\s+\d+%\|", err)}


def fit_twice(capfd, make, tmp_path) -> tuple[str, str]:
    """The federation `make(run_dir)` run with progress and without: (stderr with progress, stderr without); asserts
    that stdout has no bar and that both runs wrote the same metrics.jsonl."""
    capfd.readouterr()
    runs = {}
    for shown in (True, False):
        fed = make(tmp_path / str(shown))
        fed.progress = shown
        fed.fit()
        out, err = capfd.readouterr()
        assert not BAR.search(out), out
        runs[shown] = (err, (tmp_path / str(shown) / "metrics.jsonl").read_bytes())
    assert runs[True][1] == runs[False][1]
    assert not BAR.search(runs[False][0]), runs[False][0]
    return runs[True][0], runs[False][0]


def test_setup_stages_server_fits_and_rounds_show_bars_on_stderr_only_with_progress(tmp_path, capfd):
    public = PublicData(
        GaussianFeatures(dim=8, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=40)
    )
    err, _ = fit_twice(
        capfd,
        lambda run_dir: head_federation(
            run_dir,
            data=DATA,
            rounds=2,
            setup=[GGEUR(target_per_class=50, samples_per_prototype=20)],
            server_steps=[ServerFinetune(public, epochs=2)],
        ),
        tmp_path,
    )
    assert {"GGEUR", "server serverfinetune", "flsuite"} <= bars(err), err
    assert "3/3 [" in err and "2/2 [" in err  # GGEUR's three classes, two rounds (and the fine-tune's two epochs)


def test_fkpl_stages_show_their_queries_and_the_server_head(tmp_path, capfd):
    err, _ = fit_twice(capfd, fkpl_federation, tmp_path)
    expected = {"query fkpl/subspace", "query fkpl/prototypes", "query fkpl/virtual", "server fkpl/head"}
    assert expected <= bars(err), err


class Embedded(DataSource):
    """Two clients and a test set embedded by a tiny frozen encoder, as a benchmark with an encoder builds them."""

    def __init__(self, cache_dir) -> None:
        self.cache_dir = cache_dir

    def build(self, seed: int) -> FederatedData:
        from flsuite.data.base import ClientData

        encoder, images = CountingEncoder(), make_images(40, channels=3)
        x = extract_features(
            encoder, images, batch_size=8, cache_dir=self.cache_dir, dataset_key={"domain": "d0", "pool": "all"}
        )
        y = torch.arange(40) % 2
        return FederatedData(
            [ClientData(0, "d0", Split(x[:15], y[:15])), ClientData(1, "d0", Split(x[15:30], y[15:30]))],
            {"d0": Split(x[30:], y[30:])},
            num_classes=2,
        )


def test_feature_extraction_shows_a_bar_of_images_when_the_run_shows_progress(tmp_path, capfd):
    err, _ = fit_twice(capfd, lambda run_dir: head_federation(run_dir, data=Embedded(None), rounds=1), tmp_path)
    assert "features d0/all" in bars(err) and "40/40 [" in err, err


def test_feature_extraction_outside_a_run_is_quiet_unless_asked(capfd):
    capfd.readouterr()
    extract_features(CountingEncoder(), make_images(12, channels=3), batch_size=5)
    assert not BAR.search(capfd.readouterr().err)
    extract_features(CountingEncoder(), make_images(12, channels=3), batch_size=5, progress=True)
    assert "12/12 [" in capfd.readouterr().err


PROBE = textwrap.dedent("""
    import sys

    import torch
    from flsuite.federation.local.dynamo import compiled_copy

    torch.set_num_threads(1)
    OFFSET = float(sys.argv[1])  # a constant of the graph: new to the inductor cache, so the compilation runs


    def double(x):
        return x * 2 + OFFSET


    class Probe:  # the client class a layout names
        pass


    # every compilation of the compiled loop goes through `compiled_copy` (compiled.py's scanned SGD steps,
    # loss_grads.py's loss and gradients): the smallest graph, compiled by inductor as theirs are
    assert compiled_copy(double, (Probe, ()), 0)(torch.ones(2)).tolist() == [2.0 + OFFSET] * 2
    print("fit done")

    # the control, in the same process: torch's probe, run again now that the compiled loop's quiet import is over,
    # still warns (the condition holds here, and the filter did not outlive that import)
    import importlib
    import sys

    print("--- control ---", file=sys.stderr, flush=True)
    importlib.reload(torch.utils.cpp_extension)
""")


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.version.cuda or torch.cuda.is_available(),
    reason="the probe warns only on a CUDA build of torch without a GPU",
)
def test_the_compiled_loop_does_not_print_torchs_cuda_probe_warning(tmp_path):
    """A fresh process (the warning comes once per process, when inductor first imports torch.utils.cpp_extension),
    CUDA_HOME pointing at a folder so that the probe finds a "toolkit", and a graph the inductor cache has not seen
    (the compilation runs): the compiled loop's compilation does not print the warning; the control after it, torch's
    probe run again in that process (a reload of the module), does. The compilation is the loop's own
    (`dynamo.compiled_copy`) of the smallest graph, not a client fit's forward and backward. The process shares the
    session's inductor cache: inductor imports the module on a cache hit too (with the quiet import removed the
    warning was printed during the compilation with the graph compiled and with it cached), and a cache of its own
    made the process check the CPU's vector instruction sets again (six C++ builds, ~6 s of this test's ~14)."""
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    offset = str(1 + int.from_bytes(os.urandom(2), "big") / 2**16)  # 1 <= offset < 2, exact in float32
    fit = subprocess.run(
        [sys.executable, "-c", PROBE, offset], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert fit.returncode == 0 and "fit done" in fit.stdout, fit.stderr
    during, _, control = fit.stderr.partition("--- control ---")
    assert "No CUDA runtime is found" in control, fit.stderr  # the condition holds here
    assert "No CUDA runtime is found" not in during, fit.stderr


SERVER_FIT = textwrap.dedent("""
    import logging
    logging.basicConfig(level=logging.INFO)  # as the command line does
    import torch
    from flsuite.data.base import EpochBatches, Split
    from flsuite.federation.server import RoundServer
    from flsuite.federation.task import LocalTraining
    from flsuite.models.heads import Linear

    server = RoundServer(0, 0, [], 1, lambda: Linear().build((4,), 2))
    split = Split(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    batches = EpochBatches(split, 4, server.generator("x"), epochs=2)
    server.train(server.build_model(), batches, LocalTraining(epochs=2, batch_size=4), purpose="x")
    print("fit done")
""")


def test_a_server_fit_in_a_process_without_client_fits_prints_no_lightning_banners():
    """Under Ray the clients fit on workers, so the driver's first Trainer is a server fit's (FKPL's head, FedEGG,
    generators): it is as quiet as a client fit (no "GPU available", tips, or Lightning's pytree deprecation)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fit = subprocess.run(
        [sys.executable, "-c", SERVER_FIT], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert fit.returncode == 0 and "fit done" in fit.stdout, fit.stderr
    assert "GPU available" not in fit.stderr and "lightning" not in fit.stderr, fit.stderr
