"""FKPL Stage II (PCC, spec §1.4–1.8): the concatenated frozen experts F, the prototype and virtual-feature client
queries, the server head, the federated-head control, the per-stage cost (Tables 9–10). The equations are in
`flsuite.methods.fkpl`."""

from __future__ import annotations

import time
from typing import Any

import torch

from flsuite import records
from flsuite.data.base import EpochBatches, Split
from flsuite.federation.context import RunContext
from flsuite.federation.phases import Rounds
from flsuite.federation.query import ClientQuery, QueryOutcome, QueryTask
from flsuite.federation.server import ServerContext
from flsuite.federation.task import LocalTraining, State, Weights
from flsuite.federation.weights import clone_weights, num_bytes, weighted_average
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl_model import ConcatExperts, encode, encoder_weights, head_keys
from flsuite.methods.fkpl_stages import FKPLPhase, scalars
from flsuite.metrics import evaluate, evaluate_federation
from flsuite.models.heads import Linear
from flsuite.models.representation import check_contract

#: The metric prefix of the federated-head control's rounds (`head: federated`).
HEAD_PREFIX = "head/"


# ---- client queries ---------------------------------------------------------------------------------------------
class PrototypeQuery(ClientQuery):
    """p_m^k = mean of F(x) over the client's class-k samples, for every class it holds (uploaded with the class ids)."""

    name = "fkpl/prototypes"

    def compute(self, client, task: QueryTask, model) -> dict[str, Any]:
        z = encode(model, client.train.x).to(torch.float64)
        classes = torch.unique(client.train.y)
        return {"protos": torch.stack([z[client.train.y == k].mean(0) for k in classes]).float(), "classes": classes}


class VirtualFeatureQuery(ClientQuery):
    """Eq. (10): z̃ = w·F(x) + (1 − w)·P_v^y with w = λ (`lam_on: feature`) or 1 − λ (`lam_on: prototype`, the official
    code's (1 − λ)·f + λ·proto), λ ~ U(a, b) (rounded to `lam_decimals` when set, as the official
    `np.round(l + r_reg * np.random.random(), 2)`), all from the client's derived stream; uploads (z̃, y) only.

    Partners of a sample (x, y): `one` draws v uniformly among the clusters holding y (`other`: among the other
    clusters when one holds y), one z̃ per sample; `all` pairs it with every v ∈ V_y, one z̃ and a fresh λ per pair
    (the official `mixup_features_with_domain_protos`: `for domain_proto in protos: lam = ...`), so
    N_g = Σ_i |V_{y_i}|. `per_sample` passes R of fresh draws multiply N_g by R."""

    name = "fkpl/virtual"

    def __init__(self, a: float, b: float, lam_on: str, partner: str, per_sample: int, lam_decimals: int | None = None) -> None:
        self.a, self.b, self.lam_on, self.partner, self.per_sample, self.lam_decimals = a, b, lam_on, partner, per_sample, lam_decimals

    def lam(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """n draws of λ ~ U(a, b), [n, 1]."""
        lam = self.a + (self.b - self.a) * torch.rand(n, 1, generator=gen)
        return lam if self.lam_decimals is None else torch.round(lam, decimals=self.lam_decimals)

    def compute(self, client, task: QueryTask, model) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(task.seed)
        z, y = encode(model, client.train.x), client.train.y
        protos, has = unpack_prototypes(task.broadcast), task.broadcast["has"]
        own = int(task.broadcast["cluster"][client.client_id])
        allowed = has[:, y].T.clone()  # [n, V]
        if self.partner == "other":
            others = allowed.clone()
            others[:, own] = False
            allowed = torch.where(others.any(dim=1, keepdim=True), others, allowed)
        feats, labels = [], []
        for _ in range(self.per_sample):
            if self.partner == "all":
                i, v = allowed.nonzero(as_tuple=True)  # every (sample, cluster holding its class), sample-major
                lam = self.lam(len(i), gen)
            else:
                i = torch.arange(len(y))
                lam = self.lam(len(y), gen)
                v = torch.multinomial(allowed.float(), 1, generator=gen).squeeze(1)
            w = lam if self.lam_on == "feature" else 1.0 - lam
            feats.append(w * z[i] + (1.0 - w) * protos[v, y[i]])
            labels.append(y[i])
        return {"features": torch.cat(feats), "labels": torch.cat(labels)}


def unpack_prototypes(broadcast: dict[str, Any]) -> torch.Tensor:
    """P [V, K, d_V] from the broadcast: only the available prototypes travel ("protos" [Σ_k |V_k|, d_V], in the
    row-major order of the mask "has" [V, K]), as Table 9's M·d_V·Σ_k |V_k|; absent ones are zero (never drawn)."""
    has, packed = broadcast["has"], broadcast["protos"]
    full = packed.new_zeros(*has.shape, packed.shape[-1])
    full[has] = packed
    return full


def domain_prototypes(outcome: QueryOutcome, labels: list[int], num_classes: int) -> dict[str, torch.Tensor]:
    """P_v^k = unweighted mean of p_m^k over the members m of cluster v that hold class k (spec §1.6); `has` [V, K]."""
    uploads = outcome.uploads()
    dim = next(iter(uploads.values()))["protos"].shape[1]
    num = max(labels) + 1
    sums = torch.zeros(num, num_classes, dim, dtype=torch.float64)
    counts = torch.zeros(num, num_classes, dtype=torch.float64)
    for k, u in uploads.items():
        sums[labels[k], u["classes"]] += u["protos"].to(torch.float64)
        counts[labels[k], u["classes"]] += 1
    return {
        "protos": (sums / counts.clamp(min=1)[..., None]).float(),
        "has": counts > 0,
        "scalars_up": torch.tensor(scalars([u["protos"] for u in uploads.values()])),
    }


def fit_head(server: ServerContext, split: Split, num_classes: int, fkpl: Any, purpose: str) -> tuple[Weights, float]:
    """A linear head (with bias) trained with CE on `split` for `head_epochs` epochs as a server-side Lightning fit."""
    local = LocalTraining(
        epochs=fkpl.head_epochs, batch_size=fkpl.head_batch_size, lr=fkpl.head_lr, momentum=fkpl.head_momentum, weight_decay=0.0, accelerator=server.accelerator
    )
    torch.manual_seed(server.seed_for(f"{purpose}/init"))
    model = Linear().build(tuple(split.x.shape[1:]), num_classes)
    module = server.train(model, EpochBatches(split, local.batch_size, server.generator(f"{purpose}/batches"), epochs=local.epochs), local, purpose)
    w = clone_weights(model.state_dict())
    return {"weight": w["1.weight"], "bias": w["1.bias"]}, module.mean_loss


class FederatedHead(FedAvg):
    """The Table-5 control: FedAvg of the trainable parameters only (the head over frozen F); F is never averaged and
    only the head travels each round."""

    def aggregate(self, round: int, global_weights: Weights, results, server_state: State, ctx=None) -> tuple[Weights, State]:
        trained = weighted_average([self.travelling(r.weights, "trainable") for r in results], self.aggregation_coefficients(results))
        return {**global_weights, **trained}, server_state

    weights_up = weights_down = "trainable"


# ---- Stage II ----------------------------------------------------------------------------------------------------
class Calibrate(FKPLPhase):
    """Stage II: F = concatenated frozen experts; prototypes → domain prototypes → virtual features → server head (PCC),
    or the federated-head control; evaluates head ∘ F per domain and records the run's cost per stage."""

    def run(self, ctx: RunContext) -> None:
        f, settings, data = self.fkpl, ctx.settings, ctx.data
        labels = ctx.outputs(f.names[0])["labels"]
        num = max(labels) + 1
        experts = ctx.outputs(f.names[1])["weights"]
        with torch.random.fork_rng(devices=[]):
            dropped = head_keys(settings.model.build(data.input_shape, data.num_classes))
        enc = encoder_weights(experts, dropped)
        cost = self.stage_costs(ctx, experts, enc)
        if f.head == "federated":
            sub = Rounds(
                name=f"{self.name}/head",
                rounds=f.head_rounds,
                model=ConcatExperts(settings.model, num, enc),
                method=FederatedHead("samples"),
                server_steps=[],
                prefix=HEAD_PREFIX,
            )
            ctx.run_nested(sub, inside=self.name)
            self.log_costs(ctx, cost)
            return
        if self.done(ctx):
            return
        ctx.use(ConcatExperts(settings.model, num, with_head=False), FedAvg())
        protos = ctx.query_once(self.name, "prototypes", PrototypeQuery(), lambda o: domain_prototypes(o, labels, data.num_classes), weights=enc)
        has = protos.value["has"]
        bc = {"protos": protos.value["protos"][has], "has": has, "cluster": torch.tensor(labels)}
        query = VirtualFeatureQuery(f.a, f.b, f.lam_on, f.partner, f.virtual_per_sample, f.lam_decimals)

        def pool(outcome: QueryOutcome) -> dict[str, torch.Tensor]:
            ups = outcome.uploads()
            return {
                "x": torch.cat([ups[k]["features"] for k in sorted(ups)]),
                "y": torch.cat([ups[k]["labels"] for k in sorted(ups)]),
                "cluster": torch.cat([torch.full((len(ups[k]["labels"]),), labels[k]) for k in sorted(ups)]),  # known to the server: the sender
            }

        virtual = ctx.query_once(self.name, "virtual", query, pool, broadcast=bc, weights=enc)
        vx, vy, vc = virtual.value["x"], virtual.value["y"], virtual.value["cluster"]
        t0 = time.perf_counter()
        server = ctx.server_context(0)
        head, loss = fit_head(server, Split(vx, vy), data.num_classes, f, purpose="fkpl/head")
        t_head = time.perf_counter() - t0
        model = ConcatExperts(settings.model, num, enc).build(data.input_shape, data.num_classes)
        check_contract(model).head.load_state_dict(head)
        metrics = evaluate_federation(model, data, device=settings.eval_device)
        if f.personalized_heads:
            metrics.update(self.personalised(ctx, server, model, vx, vy, vc, labels))
        ctx.publish(self.name, {"head": head})
        cost.update(
            {
                "stage2/scalars_up/prototypes": int(protos.value["scalars_up"]),
                "stage2/scalars_down/domain_prototypes": len(data.clients) * int(protos.value["has"].sum()) * vx.shape[1],
                "stage2/scalars_up/virtual_features": scalars(vx),
                "stage2/num_virtual": len(vy),
                "stage2/bytes_up": protos.bytes_up + virtual.bytes_up,
                "stage2/bytes_down": protos.bytes_down + virtual.bytes_down,
                "stage2/time/prototypes_s": protos.seconds,
                "stage2/time/virtual_s": virtual.seconds,
                "stage2/time/head_fit_s": t_head,
            }
        )
        counts = {k: v for k, v in cost.items() if "time" not in k}  # wall times go to timings.jsonl, not the record
        record = records.record(1, metrics, {f"{records.SERVER_PREFIX}head_loss": loss, "d_V": int(vx.shape[1]), **counts}, phase=self.name)
        timing = records.record(1, {k: v for k, v in cost.items() if "time" in k}, phase=self.name)
        ctx.commit(record, timing, checkpoint=True)
        self.log_costs(ctx, cost)

    def personalised(self, ctx: RunContext, server: ServerContext, model, vx, vy, vc, labels: list[int]) -> dict[str, float]:
        """Per-cluster heads on that cluster's virtual features (Fig. 6): pcluster<v>/acc/<domain>, and personal/acc/<d>
        with each domain served by the head of the cluster holding most of its clients."""
        data, out, heads = ctx.data, {}, []
        for v in range(max(labels) + 1):
            mask = vc == v
            head, _ = fit_head(server, Split(vx[mask], vy[mask]), data.num_classes, self.fkpl, purpose=f"fkpl/head{v}")
            heads.append(head)
            model.head.load_state_dict(head)
            out.update({f"pcluster{v}/{k}": val for k, val in evaluate(model, data.test, data.num_classes).items()})
        domains = [c.domain for c in data.clients]
        for d in data.test:
            votes = [labels[k] for k, dom in enumerate(domains) if dom == d]
            v = max(set(votes), key=votes.count) if votes else 0
            out[f"personal/acc/{d}"] = out[f"pcluster{v}/acc/{d}"]
        vals = [out[f"personal/acc/{d}"] for d in data.test]
        out["personal/acc_mean"] = sum(vals) / len(vals)
        return out

    def stage_costs(self, ctx: RunContext, experts: list[Weights], enc: Weights) -> dict[str, Any]:
        """Tables 9–10 for Stages 0 and I from their records, and the encoder download (M·V·P_f, once per client)."""
        s0, t0 = ctx.records(self.fkpl.names[0])[0], ctx.timings(self.fkpl.names[0])[0]
        phases = ctx.outputs(self.fkpl.names[1])["phases"]
        s1 = [r for p in phases for r in ctx.records(p)]
        t1 = [t for p in phases for t in ctx.timings(p)]

        def total(rows, suffix):
            return sum(v for r in rows for k, v in r.items() if k.endswith(suffix) and isinstance(v, (int, float)))

        m = len(ctx.data.clients)
        return {
            "stage0/bytes_up": s0[records.BYTES_UP],
            "stage0/scalars_up": s0["scalars_up"],
            "stage0/time/preprocess_s": t0["time/preprocess_s"],
            "stage0/time/cluster_s": t0["time/cluster_s"],
            "stage1/bytes_up": total(s1, f"/{records.BYTES_UP}"),
            "stage1/bytes_down": total(s1, f"/{records.BYTES_DOWN}"),
            "stage1/scalars_per_expert": [scalars(w) for w in experts],
            "stage1/rounds": len({r[records.ROUND] for r in s1}),
            "stage1/time_s": total(t1, f"/{records.ROUND_SECONDS}"),
            "stage2/encoder_bytes_down": m * num_bytes(enc),
            "stage2/encoder_scalars_down": m * scalars(enc),
        }

    def log_costs(self, ctx: RunContext, cost: dict[str, Any]) -> None:
        """The per-stage costs into setup.json (merged with what is there) and the W&B summary."""
        ctx.tracker.add_setup({f"fkpl/{k}": v for k, v in cost.items()})

    def summary_extras(self, state) -> dict[str, Any]:
        """Tables 9–10 in summary.json: the per-stage counts of this phase's record (wall times: timings.jsonl)."""
        record: dict[str, Any] = next((r for r in reversed(state.history) if r.get(records.PHASE) == self.name), {})
        return {f"fkpl/{k}": v for k, v in record.items() if k.startswith(("stage0/", "stage1/", "stage2/"))}

    def summary_records(self, history) -> list[dict[str, Any]]:
        if self.fkpl.head == "federated":
            return [records.without_prefix(r, HEAD_PREFIX) for r in history if r.get(records.PHASE) == f"{self.name}/head"]
        return [r for r in history if r.get(records.PHASE) == self.name]
