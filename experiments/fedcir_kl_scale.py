"""The effective scale of FedCiR's L_align (spec §7.1): for finished FedCiR runs, the mean KL(p(z|x) ‖ q(z|y)) over each
client's training data under the final global encoder and the final (μ_g, σ_g), next to λ_align · KL and the
cross-entropy of the same data (z = μ).

    python experiments/fedcir_kl_scale.py runs/fedcir_pacs/fedcir-reg-0-5-align-5-0e-6/seed0 [more run folders]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from flsuite.cli import build_federation
from flsuite.cli_parsers import fit_parser
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.methods.fedcir import SIGMA_G_MIN
from flsuite.methods.generators import gaussian_kl


@torch.no_grad()
def kl_scale(run_dir: Path) -> dict[str, float]:
    parser = fit_parser()
    fed = build_federation(parser, parser.parse_args(["--config", str(run_dir / "config.yaml")]))
    data = fed.data.build(fed.seeds.data)  # the run's clients: its data seed
    state = load_checkpoint(run_dir)
    if "mu_g" not in state.server_state:
        raise SystemExit(f"{run_dir}: no μ_g/σ_g in the server state (not FedCiR with lam_align > 0)")
    model = fed.model.build(data.input_shape, data.num_classes).eval()
    model.load_state_dict(state.global_weights)
    mu_g, sigma_g = state.server_state["mu_g"], state.server_state["sigma_g"].clamp_min(SIGMA_G_MIN)
    x = torch.cat([c.train.x for c in data.clients])
    y = torch.cat([c.train.y for c in data.clients])
    mu, sigma = model.encode(x)
    kl = float(gaussian_kl(mu, sigma, mu_g[y], sigma_g[y]).mean())
    ce = float(F.cross_entropy(model.fc(mu), y))
    return {"kl": kl, "lam_align": fed.method.lam_align, "lam_align_x_kl": fed.method.lam_align * kl, "ce": ce}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+")
    args = ap.parse_args()
    print("| run | mean KL | λ_align | λ_align · KL | CE (z = μ) |")
    print("|---|---|---|---|---|")
    for run in args.runs:
        r = kl_scale(run)
        print(f"| {run} | {r['kl']:.1f} | {r['lam_align']:g} | {r['lam_align_x_kl']:.2e} | {r['ce']:.3f} |")


if __name__ == "__main__":
    main()
