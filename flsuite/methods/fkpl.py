"""FKPL (Wu, Ji, Li, Xiong, Pan: "Rethinking Model Aggregation for Federated Learning with Domain Skew: A
Knowledge-Preserving Perspective"), a protocol of three phases (spec ../shared/methods/fkpl.md; the paper text has no
equations, so the formulas below are the spec's reconstruction, each with its spec row):

Stage 0 (§1.2, `fkpl_cluster`): client m uploads U_m, the top-p left singular vectors of X_m (p = 10, whole client;
    per-class PACFL variant by flag); the server sets A_ij = θ1(U_i, U_j) = arccos σ_max(U_iᵀU_j) in degrees (the
    PACFL entrywise min arccos by flag) and clusters with average-linkage agglomerative clustering at a threshold in
    degrees (scikit-learn). V = number of clusters. Logs fkpl_angles.png, fkpl_clusters.json, purity, a threshold scan.
Stage I (§1.3): per cluster v, FedAvg over its members, every member every round, w_v ← Σ_{m∈C_v} n_m w_m / Σ n_m;
    a singleton trains alone. One `Rounds` per cluster (metrics "expert<v>/…").
Stage II (§1.4–1.8, PCC): F(x) = [f_1(x); …; f_V(x)] frozen (expert heads dropped); client m uploads p_m^k = mean F(x)
    over its class-k samples; the server forms P_v^k = mean_{m∈C_v, k∈K_m} p_m^k (unweighted, §7.8); client m uploads
    z̃ = λ·F(x) + (1 − λ)·P_v^y, λ ~ U(a, b), v uniform over the clusters holding y (Eq. 10, §1.7); the server trains a
    linear head on {(z̃, y)} for 200 epochs (SGD 0.01, momentum 0.9, batch 64: §3 [OURS]); the model is head ∘ F.

Only U_m (Stage 0), expert weights (Stage I), prototypes and virtual features (Stage II) leave a client; every
exchange is a client query or a round, so its bytes are counted by the engine (`query/fkpl/...`, per-round bytes).

Decisions (spec row → choice; deviations marked):
- §7.4 θ1: exact principal angle by default; thresholds need a scan on other preprocessing (paper's as first try).
- §1.2 scikit-learn merges while the linkage distance is *below* the threshold (the spec says ≤; equal only on ties).
- §1.2 X_m is the client's input as the federation sees it: raw flattened pixels in the image configs, the frozen
  EfficientNet-Lite0 features in the CPU configs (deviation: the paper's SVD is on raw pixels; the CPU configs have
  no pixels in memory, and their thresholds are chosen by the scan).
- §1.3 Stage I is one FedAvg `Rounds` per cluster, run one after another, not one joint round over all clusters:
  a one-cluster Stage I is then a plain FedAvg run by construction, and a kill resumes inside the expert it hit. Per
  round, the clients of different clusters are not interleaved (the result is the same; wall time is summed).
- §7.1 λ weights the feature (`lam_on: feature`); the official code's (1 − a)·f + a·proto with a ~ U(lo, hi) is
  `lam_on: prototype` with (a, b) = (lo, hi). Default (a, b) = (0.5, 1.0). No Beta draw (not implemented).
- §7.2 partner v uniform over every cluster that has class y (own included); `partner: other` excludes the client's
  own cluster when another one has y.
- §7.3 one virtual feature per sample per pass, `virtual_per_sample` passes; the server does not train on raw prototypes.
- §1.4 encoders in eval mode; no feature normalisation.
- §1.8 the head download is not counted by Table 9; the concatenated encoder is counted once per client
  (`stage2/encoder_bytes_down`): the engine's query counters re-send F with the virtual-feature query because
  simulated clients keep nothing between queries, so `query/fkpl/virtual/bytes_down` includes F a second time.
- Controls (Tables 5–6): `head: federated` trains the head by FedAvg over all clients on frozen F (`head_rounds`
  rounds, only the head travels); `assignment: single` puts every client in one cluster (one FedAvg encoder, then
  PCC); `assignment: domains` uses the true domains (an oracle, ours).
- §1.9 `personalized_heads`: one head per cluster on its clients' virtual features (ours; Fig. 6's numbers unknown).
"""

from __future__ import annotations

from typing import Literal

from flsuite.federation.phases import Phase
from flsuite.methods.fedavg import FedAvg


class FKPL(FedAvg):
    """FKPL as its own protocol (`protocol()`); used under a plain `Rounds`, it is FedAvg.

    Args:
        threshold: Stage 0 distance threshold in degrees (paper: Office 5.3, PACS 4.2, DomainNet-4 11.5).
        basis: Basis vectors per client p (paper: 10).
        per_class: PACFL's per-class SVD (the budget split over the client's classes) instead of one whole-client SVD.
        angle: "exact" principal angle θ1, or "pacfl" (PACFL code's minimum entrywise arccos).
        assignment: "subspace" (Stage 0 as in the paper), "single" (one cluster: the FedAvg-encoder control of Table 6)
            or "domains" (the true domains, an oracle).
        expert_rounds: Stage I rounds per expert; null = the federation's `rounds`.
        head: "server" (PCC) or "federated" (the Table 5 control).
        head_epochs: Server head epochs (paper: 200).
        head_lr: Server head SGD learning rate.
        head_momentum: Server head SGD momentum.
        head_batch_size: Server head mini-batch size.
        head_rounds: Rounds of the federated-head control; null = the federation's `rounds`.
        a: Lower mixing bound of λ ~ U(a, b) (Eq. 10).
        b: Upper mixing bound.
        lam_on: Which side λ weights: "feature" (z̃ = λF(x) + (1 − λ)P) or "prototype" (z̃ = (1 − λ)F(x) + λP, the
            official code's form).
        partner: Prototype partner v: "any" cluster holding class y, or "other" clusters when one holds y.
        virtual_per_sample: Virtual features per local sample (R passes of fresh (λ, v) draws).
        personalized_heads: Also train and evaluate one head per cluster.
    """

    #: Phase names: Stage 0, Stage I, Stage II.
    names = ("cluster", "experts", "calibrate")

    def __init__(
        self,
        threshold: float = 5.3,
        basis: int = 10,
        per_class: bool = False,
        angle: Literal["exact", "pacfl"] = "exact",
        assignment: Literal["subspace", "single", "domains"] = "subspace",
        expert_rounds: int | None = None,
        head: Literal["server", "federated"] = "server",
        head_epochs: int = 200,
        head_lr: float = 0.01,
        head_momentum: float = 0.9,
        head_batch_size: int = 64,
        head_rounds: int | None = None,
        a: float = 0.5,
        b: float = 1.0,
        lam_on: Literal["feature", "prototype"] = "feature",
        partner: Literal["any", "other"] = "any",
        virtual_per_sample: int = 1,
        personalized_heads: bool = False,
    ) -> None:
        super().__init__("samples")
        checks = {
            "threshold must be >= 0": threshold >= 0,
            "basis must be >= 1": basis >= 1,
            "angle must be 'exact' or 'pacfl'": angle in ("exact", "pacfl"),
            "assignment must be 'subspace', 'single' or 'domains'": assignment in ("subspace", "single", "domains"),
            "head must be 'server' or 'federated'": head in ("server", "federated"),
            "need 0 <= a <= b <= 1": 0.0 <= a <= b <= 1.0,
            "lam_on must be 'feature' or 'prototype'": lam_on in ("feature", "prototype"),
            "partner must be 'any' or 'other'": partner in ("any", "other"),
            "head_epochs, head_batch_size, virtual_per_sample must be >= 1": min(head_epochs, head_batch_size, virtual_per_sample) >= 1,
            "head_lr must be > 0": head_lr > 0,
            "expert_rounds and head_rounds must be >= 1 or null": all(r is None or r >= 1 for r in (expert_rounds, head_rounds)),
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"FKPL: {'; '.join(bad)}")
        self.threshold, self.basis, self.per_class, self.angle, self.assignment = threshold, basis, per_class, angle, assignment
        self.expert_rounds, self.head, self.head_epochs, self.head_lr = expert_rounds, head, head_epochs, head_lr
        self.head_momentum, self.head_batch_size, self.head_rounds = head_momentum, head_batch_size, head_rounds
        self.a, self.b, self.lam_on, self.partner = a, b, lam_on, partner
        self.virtual_per_sample, self.personalized_heads = virtual_per_sample, personalized_heads

    def protocol(self) -> list[Phase]:
        from flsuite.methods.fkpl_calibrate import Calibrate
        from flsuite.methods.fkpl_stages import ClusterClients, TrainExperts

        return [ClusterClients(self, self.names[0]), TrainExperts(self, self.names[1]), Calibrate(self, self.names[2])]
