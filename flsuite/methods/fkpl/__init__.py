"""FKPL (Wu, Ji, Li, Xiong, Pan: "Rethinking Model Aggregation for Federated Learning with Domain Skew: A
Knowledge-Preserving Perspective"), a protocol of three phases (spec ../shared/methods/fkpl.md; the paper text has no
equations, so the formulas below are the spec's reconstruction, each with its spec row):

Stage 0 (§1.2; `subspace`, `cluster`, `clustering`): client m uploads U_m, the top-p left singular vectors of X_m
    (p = 10, whole client; per class by flag, the budget split equally or by the official count rule); the server
    sets A_ij = θ1(U_i, U_j) = arccos σ_max(U_iᵀU_j) in degrees (the PACFL entrywise min arccos by flag) and
    clusters with average-linkage agglomerative clustering at a threshold in degrees (scikit-learn; the official
    code's pairwise-mean rule by flag). V = number of clusters. Stage 0 may see its own inputs (resized, augmented,
    ImageNet-normalised: the official code's); configs/fkpl/stage0_official.yaml sets the official Stage 0 whole.
    Logs fkpl_angles.png, fkpl_clusters.json, purity, a threshold scan.
Stage I (§1.3; `experts`): per cluster v, FedAvg over its members, every member every round,
    w_v ← Σ_{m∈C_v} n_m w_m / Σ n_m; a singleton trains alone. One `Rounds` per cluster (metrics "expert<v>/…"). Every
    expert starts from one `model_init` draw (`expert_init: shared`, as the official code: each cluster's model starts
    from one client's weights) or from its own stream derived from (seed, cluster) (`expert_init: independent`).
Stage II (§1.4–1.8, PCC; `calibrate`, `prototypes`, `head`, `model`): F(x) = [f_1(x); …; f_V(x)] frozen (expert heads
dropped); client m uploads p_m^k = mean F(x)
    over its class-k samples; the server forms P_v^k = mean_{m∈C_v, k∈K_m} p_m^k (unweighted, §7.8); client m uploads
    z̃ = λ·F(x) + (1 − λ)·P_v^y, λ ~ U(a, b) (Eq. 10, §1.7), with one partner v drawn uniformly among the clusters
    holding y (`partner: one`) or one z̃ for every v ∈ V_y, a fresh λ per pair (`partner: all`, the official code's
    domain-balanced set: N_g = Σ_i |V_{y_i}|); the server trains a linear head on {(z̃, y)} for 200 epochs (SGD 0.01,
    momentum 0.9, batch 64: §3 [OURS]); the model is head ∘ F.

Only U_m (Stage 0), expert weights (Stage I), prototypes and virtual features (Stage II) leave a client; every
exchange is a client query or a round, so its bytes are counted by the engine (`query/fkpl/...`, per-round bytes);
F travels with both Stage-II queries and is counted once per client (a client keeps the weights a query sent it).
Every decision taken where the spec is open (spec row → choice, deviations marked): docs/fkpl.md "Decisions".

The package: `settings` (one checked dataclass per stage), the three phases (`clustering`, `experts`, `calibrate`),
what they compute (`subspace`, `cluster`, `prototypes`, `head`, `model`) and the cost table (`costs`). Each phase
takes its stage's settings and reads the earlier phases' published outputs as typed values, never this object.
"""

from __future__ import annotations

from flsuite.federation.phases import Phase
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl.calibrate import Calibrate
from flsuite.methods.fkpl.clustering import ClusterClients
from flsuite.methods.fkpl.experts import TrainExperts
from flsuite.methods.fkpl.settings import (
    Angle,
    Assignment,
    CalibrationSettings,
    ClassBudget,
    ClusterSettings,
    ExpertInit,
    ExpertSettings,
    Head,
    LamOn,
    Linkage,
    Partner,
)
from flsuite.methods.fkpl.subspace import SubspaceBasis

__all__ = ["FKPL"]


class FKPL(FedAvg):
    """FKPL as its own protocol (`protocol()`); used under a plain `Rounds`, it is FedAvg.

    The options build the three stage settings (`stage0`: `ClusterSettings`, `stage1`: `ExpertSettings`, `stage2`:
    `CalibrationSettings`), each checked as it is built; each phase of the protocol takes its own.

    Args:
        threshold: Stage 0 distance threshold in degrees (paper: Office 5.3, PACS 4.2, DomainNet-4 11.5).
        basis: Basis vectors per client p (paper: 10).
        per_class: PACFL's per-class SVD (the budget split over the client's classes) instead of one whole-client SVD.
        angle: "exact" principal angle θ1, or "pacfl" (PACFL code's minimum entrywise arccos).
        class_budget: With `per_class`: "floor" (⌊p/|K_m|⌋ ≥ 1 vectors per class) or "counts" (the official code's
            count-proportional split of p, `subspace.class_budget`).
        linkage: "average" (scikit-learn, UPGMA, merge below the threshold) or "weighted" (the official code's
            agglomeration: pairwise-mean rows, merge at or below the threshold).
        stage0_size: Resize Stage 0's inputs to this side (the official code: 32); null = as the data holds them.
        stage0_augment: Stage 0 sees each sample once through the official training augmentation (zero padding 4,
            random crop, horizontal flip), drawn from the query's derived seed.
        stage0_normalize: ImageNet mean/std normalisation of Stage 0's inputs (the official transform's); the
            training inputs are untouched.
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
        lam_decimals: Round each λ draw to this many decimals (the official code: `np.round(a + (b − a)·U, 2)`);
            null keeps it unrounded.
        partner: The prototype partners of a sample (x, y): "one" v drawn uniformly among the clusters holding y;
            "other" the same draw among the other clusters when one holds y; "all" every v ∈ V_y, one z̃ per pair
            (the official code's `mixup_features_with_domain_protos`).
        virtual_per_sample: Passes R over the local samples, each with fresh draws (N_g = R·n_m for "one"/"other",
            R·Σ_i |V_{y_i}| for "all").
        expert_init: "shared" (every expert starts from one `model_init` draw, as the official code) or
            "independent" (expert v from its own stream, derived from (seed, cluster v)).
        personalized_heads: Also train and evaluate one head per cluster.
    """

    #: Phase names: Stage 0, Stage I, Stage II.
    names = ("cluster", "experts", "calibrate")

    def __init__(
        self,
        threshold: float = ClusterSettings.threshold,
        basis: int = ClusterSettings.basis,
        per_class: bool = ClusterSettings.per_class,
        angle: Angle = ClusterSettings.angle,
        class_budget: ClassBudget = ClusterSettings.class_budget,
        linkage: Linkage = ClusterSettings.linkage,
        stage0_size: int | None = ClusterSettings.stage0_size,
        stage0_augment: bool = ClusterSettings.stage0_augment,
        stage0_normalize: bool = ClusterSettings.stage0_normalize,
        assignment: Assignment = ClusterSettings.assignment,
        expert_rounds: int | None = ExpertSettings.expert_rounds,
        head: Head = CalibrationSettings.head,
        head_epochs: int = CalibrationSettings.head_epochs,
        head_lr: float = CalibrationSettings.head_lr,
        head_momentum: float = CalibrationSettings.head_momentum,
        head_batch_size: int = CalibrationSettings.head_batch_size,
        head_rounds: int | None = CalibrationSettings.head_rounds,
        a: float = CalibrationSettings.a,
        b: float = CalibrationSettings.b,
        lam_on: LamOn = CalibrationSettings.lam_on,
        lam_decimals: int | None = CalibrationSettings.lam_decimals,
        partner: Partner = CalibrationSettings.partner,
        virtual_per_sample: int = CalibrationSettings.virtual_per_sample,
        expert_init: ExpertInit = ExpertSettings.expert_init,
        personalized_heads: bool = CalibrationSettings.personalized_heads,
    ) -> None:
        options = dict(locals())  # the defaults above are the stage settings' own
        super().__init__("samples")
        self.stage0, self.stage1, self.stage2 = (
            ClusterSettings.of(options),
            ExpertSettings.of(options),
            CalibrationSettings.of(options),
        )

    def subspace_query(self) -> SubspaceBasis:
        """Stage 0's client query as configured (the run, experiments/fkpl_stage0.py and the config tests use it)."""
        return SubspaceBasis.of(self.stage0)

    def protocol(self) -> list[Phase]:
        cluster, experts, calibrate = self.names
        return [
            ClusterClients(self.stage0, cluster),
            TrainExperts(self.stage1, experts, clusters=cluster),
            Calibrate(self.stage2, calibrate, clusters=cluster, experts=experts),
        ]
