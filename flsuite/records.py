"""The record schema: the keys of a run folder's `metrics.jsonl` (one record per committed step), `timings.jsonl`
and `summary.json`. Phases write them (`flsuite.federation.phases`, FKPL's stages); metrics, tracking, compare and
sweep read them through the names here instead of guessing from the shapes of the files.

A round record (`Rounds`):

| key | value |
|---|---|
| `round` | the round, 1-based (0 for a one-shot step before rounds, e.g. FKPL's clustering) |
| `phase` | the phase's name; absent for the default protocol's rounds (un-prefixed names) |
| `clients`, `clients_failed`, `clients_rejected` | client ids: sampled; failed; whose updates were non-finite |
| `train_loss` | sample-weighted mean of the clients' mean mini-batch losses |
| `bytes_down`, `bytes_up` | what the round sent, summed over clients |
| `client_loss`, `client_steps` | {client id (a string): mean loss, optimiser steps} |
| `client/<method>/<metric>` | `ClientModule.metrics`, sample-weighted over the clients reporting it (none: no key) |
| `server/<name>/<metric>` | what the method's server update and the server steps report |
| `acc/<domain>`, `acc_mean`, `acc_std`, `acc_std_sample` | evaluation, in rounds that evaluate (`eval_every`) |

A phase with a metric prefix (e.g. `expert0/`) writes `{"round", "phase", "<prefix><key>": ...}`. A timing record
has `round` (and `phase`) and `time/round_s`, `time/clients_s`, `time/eval_s`, prefixed the same way. Every phase
builds its records and timings with `record(round, *parts, phase=, prefix=)` (bytes as the part `traffic(up, down)`),
never by writing these keys itself.

The summary (`flsuite.metrics.final_summary`): `last<k>/<acc key>` (averages over the last k evaluated rounds),
`last<k>/rounds`, `last/<acc key>`, `best/acc_mean`, `best/round`, `rounds_to_target`, `target_acc`, and the byte
totals of client queries `query/<query name>/{calls,bytes_up,bytes_down}`; `setup.json` holds the setup stages'
`setup/<stage>/<metric>`.

W&B also receives `total/bytes_up` and `total/bytes_down` with each round (the tracker's running totals, not in
metrics.jsonl), and the methods' own diagnostics below are declared here for dashboards (`flsuite.dashboard`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ROUND = "round"
PHASE = "phase"
CLIENTS, CLIENTS_FAILED, CLIENTS_REJECTED = "clients", "clients_failed", "clients_rejected"
TRAIN_LOSS = "train_loss"
BYTES_UP, BYTES_DOWN = "bytes_up", "bytes_down"
CLIENT_LOSS, CLIENT_STEPS = "client_loss", "client_steps"
SERVER_PREFIX = "server/"
CLIENT_PREFIX = "client/"
ACC_PREFIX = "acc/"
ACC_MEAN, ACC_STD, ACC_STD_SAMPLE = "acc_mean", "acc_std", "acc_std_sample"
#: Prefix of the same evaluation on the validation split (`validation.fraction` > 0): `val/acc/<domain>`,
#: `val/acc_mean`, ... in evaluated rounds, and `last<k>/val/...` in the summary.
VAL_PREFIX = "val/"
#: Timing keys of a round.
ROUND_SECONDS, CLIENTS_SECONDS, EVAL_SECONDS = "time/round_s", "time/clients_s", "time/eval_s"
#: Summary keys besides the last-k averages.
LAST_PREFIX = "last/"
BEST_ACC_MEAN, BEST_ROUND = "best/acc_mean", "best/round"
ROUNDS_TO_TARGET, TARGET_ACC = "rounds_to_target", "target_acc"
QUERY_PREFIX, SETUP_PREFIX = "query/", "setup/"
#: After a last-k prefix (`last5/rounds`): how many evaluated rounds the last-k averages cover.
LAST_K_ROUNDS = "rounds"

#: W&B-only history keys (`flsuite.tracking`, not in metrics.jsonl): the bytes of every `Rounds` phase's rounds so far,
#: logged beside each round, because a W&B line plot cannot cumulate a metric (dashboards' cumulative communication).
TOTAL_BYTES_UP, TOTAL_BYTES_DOWN = "total/bytes_up", "total/bytes_down"

# Methods' own diagnostics, declared here so dashboards name them from one place (their writers are named; a test
# compares these with what a real run of each method logs).
#: FedEGG (a server step named `fedegg`): the guiding update's size relative to the round's aggregated update (0 in
#: unguided rounds) and whether the round was guided (`gate`, 0 or 1) — flsuite/methods/fedegg.py `FedEGG.step`.
FEDEGG_UPDATE_RATIO, FEDEGG_GATE = "server/fedegg/update_ratio", "server/fedegg/gate"
#: FedCiR: each weighted term's share of the clients' loss, λ_t L_t / L — flsuite/methods/fedcir_terms.py.
FEDCIR_LOSS_SHARES = ("client/fedcir/reg_loss_share", "client/fedcir/align_loss_share")
# FKPL (flsuite/methods/fkpl/; its records in docs/fkpl.md).
#: Metric prefixes: expert v's Stage-I rounds (`fkpl_expert_prefix`), the federated-head control's rounds, the
#: personalised heads (`personal/acc/<d>`, `personal/acc_mean`; cluster v's head: `fkpl_cluster_head_prefix`).
FKPL_HEAD_PREFIX, FKPL_PERSONAL_PREFIX = "head/", "personal/"
#: Stage 0's record (phase `cluster`): V, purity, threshold, labels, the bases' float scalars (and `bytes_up`); its
#: timing: the bases' exchange and the clustering.
FKPL_NUM_CLUSTERS, FKPL_PURITY, FKPL_THRESHOLD, FKPL_LABELS = (
    "cluster/num_clusters",
    "cluster/purity",
    "cluster/threshold",
    "cluster/labels",
)
SCALARS_UP = "scalars_up"
FKPL_PREPROCESS_SECONDS, FKPL_CLUSTER_SECONDS = "time/preprocess_s", "time/cluster_s"
#: Stage II's record (phase `calibrate`): the server head's loss and F's width d_V, then the cost table (Tables 9–10,
#: flsuite/methods/fkpl/costs.py): its counts in the record, its wall times in the timing, all of it under
#: `FKPL_SUMMARY_PREFIX` in setup.json and the summary.
FKPL_HEAD_LOSS, FKPL_FEATURE_DIM = f"{SERVER_PREFIX}head_loss", "d_V"
FKPL_STAGE_PREFIXES, FKPL_SUMMARY_PREFIX = ("stage0/", "stage1/", "stage2/"), "fkpl/"
FKPL_STAGE0_BYTES_UP, FKPL_STAGE0_SCALARS_UP = "stage0/bytes_up", "stage0/scalars_up"
FKPL_STAGE0_PREPROCESS_SECONDS, FKPL_STAGE0_CLUSTER_SECONDS = "stage0/time/preprocess_s", "stage0/time/cluster_s"
FKPL_STAGE1_BYTES_UP, FKPL_STAGE1_BYTES_DOWN, FKPL_STAGE1_SECONDS = (
    "stage1/bytes_up",
    "stage1/bytes_down",
    "stage1/time_s",
)
FKPL_STAGE1_SCALARS_PER_EXPERT, FKPL_STAGE1_ROUNDS = "stage1/scalars_per_expert", "stage1/rounds"
FKPL_ENCODER_BYTES_DOWN, FKPL_ENCODER_SCALARS_DOWN = "stage2/encoder_bytes_down", "stage2/encoder_scalars_down"
FKPL_PROTOTYPE_SCALARS_UP, FKPL_DOMAIN_PROTOTYPE_SCALARS_DOWN = (
    "stage2/scalars_up/prototypes",
    "stage2/scalars_down/domain_prototypes",
)
FKPL_VIRTUAL_SCALARS_UP, FKPL_NUM_VIRTUAL = "stage2/scalars_up/virtual_features", "stage2/num_virtual"
FKPL_STAGE2_BYTES_UP, FKPL_STAGE2_BYTES_DOWN = "stage2/bytes_up", "stage2/bytes_down"
FKPL_PROTOTYPES_SECONDS, FKPL_VIRTUAL_SECONDS, FKPL_HEAD_FIT_SECONDS = (
    "stage2/time/prototypes_s",
    "stage2/time/virtual_s",
    "stage2/time/head_fit_s",
)
#: The per-stage costs dashboards show (summary and setup.json).
FKPL_STAGE_BYTES_UP = tuple(
    FKPL_SUMMARY_PREFIX + k for k in (FKPL_STAGE0_BYTES_UP, FKPL_STAGE1_BYTES_UP, FKPL_STAGE2_BYTES_UP)
)
FKPL_STAGE_BYTES_DOWN = tuple(
    FKPL_SUMMARY_PREFIX + k for k in (FKPL_STAGE1_BYTES_DOWN, FKPL_STAGE2_BYTES_DOWN, FKPL_ENCODER_BYTES_DOWN)
)
FKPL_STAGE_SECONDS = tuple(
    FKPL_SUMMARY_PREFIX + k for k in (FKPL_STAGE0_CLUSTER_SECONDS, FKPL_STAGE1_SECONDS, FKPL_HEAD_FIT_SECONDS)
)

#: Keys a round record carries every evaluated round (what a sweep can report per round); everything else is a
#: summary key.
PER_ROUND = re.compile(r"acc/.+|acc_mean|acc_std|acc_std_sample|train_loss")


def declared_names() -> frozenset[str]:
    """Every key this module names as a constant (single keys and the methods' key tuples), prefixes left out."""
    names: set[str] = set()
    for name, value in globals().items():
        if name.isupper() and isinstance(value, str) and not value.endswith("/"):
            names.add(value)
        elif name.isupper() and isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            names.update(v for v in value if not v.endswith("/"))
    return frozenset(names)


def is_declared(key: str) -> bool:
    """Whether `key` is a key of this schema: a declared name, `acc/<domain>`, or either under `val/` and under a
    summary prefix (`last<k>/`, `last/`, `best/`), e.g. `last5/val/acc/mnist`."""
    base = round_key_of(key).removeprefix(VAL_PREFIX)
    return base in declared_names() or (base.startswith(ACC_PREFIX) and len(base) > len(ACC_PREFIX))


def round_bytes(record: Mapping[str, Any]) -> tuple[float, float]:
    """(bytes up, bytes down) of the rounds a record holds: every prefix under which it has `<prefix>clients` and
    `<prefix>bytes_up` ("" for plain rounds, `expert<v>/` for FKPL's); (0, 0) for other records."""
    prefixes = [
        k.removesuffix(CLIENTS)
        for k in record
        if (k == CLIENTS or k.endswith(f"/{CLIENTS}")) and f"{k.removesuffix(CLIENTS)}{BYTES_UP}" in record
    ]
    return (
        sum(float(record[f"{p}{BYTES_UP}"]) for p in prefixes),
        sum(float(record.get(f"{p}{BYTES_DOWN}", 0)) for p in prefixes),
    )


@dataclass
class RoundTraffic:
    """The bytes of the run's rounds so far, logged to W&B beside each round (`total/bytes_up`, `total/bytes_down`):
    W&B's line plots cannot cumulate a metric. W&B only, so metrics.jsonl keeps exactly the round records."""

    up: float = 0.0
    down: float = 0.0

    def add(self, record: Mapping[str, Any]) -> dict[str, float]:
        """Count a record's rounds; their running totals, or nothing for a record that holds no round."""
        up, down = round_bytes(record)
        if not (up or down):
            return {}
        self.up, self.down = self.up + up, self.down + down
        return {TOTAL_BYTES_UP: self.up, TOTAL_BYTES_DOWN: self.down}


def is_accuracy_key(key: str) -> bool:
    """`acc/<domain>` and the `acc_*` statistics (`acc_mean`, `acc_std`, `acc_std_sample`): what evaluation writes."""
    return key.startswith((ACC_PREFIX, "acc_"))


def client_metric_key(method: str, metric: str) -> str:
    """The round-record key of a metric the clients report: `client/<method>/<metric>`, <method> the method's class
    name lower-cased (`FedCiR`, `align` -> `client/fedcir/align`)."""
    return f"{CLIENT_PREFIX}{method.lower()}/{metric}"


def fkpl_expert_prefix(v: int) -> str:
    """The metric prefix of FKPL's expert v in Stage I: `expert<v>/`."""
    return f"expert{v}/"


def fkpl_cluster_head_prefix(v: int) -> str:
    """The metric prefix of FKPL's personalised head of cluster v: `pcluster<v>/`."""
    return f"pcluster{v}/"


def last_k_prefix(last_k: int) -> str:
    """The summary-key prefix of the last-k averages, e.g. `last5/` (it follows `last_k`, never a fixed 5)."""
    return f"last{last_k}/"


def last_k_of(prefix: str) -> int:
    """`last_k_prefix` undone: the k of a last-k prefix (`last5/` -> 5)."""
    m = re.fullmatch(r"last(\d+)/", prefix)
    if not m:
        raise ValueError(f"{prefix!r} is not a last-k prefix (last<k>/)")
    return int(m.group(1))


def round_key_of(summary_key: str) -> str:
    """The round key a summary key summarises over rounds (`last5/acc_mean`, `last/acc_mean`, `best/acc_mean` ->
    `acc_mean`); any other key as it is."""
    m = re.match(r"(last\d*|best)/", summary_key)
    return summary_key[m.end() :] if m else summary_key


def summary_prefix(summary: Mapping[str, object]) -> str:
    """The last-k prefix a summary was written with (`last5/` for `last_k=5`), read from its keys."""
    for key in summary:
        m = re.fullmatch(r"(last\d+/)acc_mean", key)
        if m:
            return m.group(1)
    raise KeyError("summary has no last<k>/acc_mean key (an unfinished run, or not a flsuite summary)")


def evaluated(history: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records of rounds that evaluated the global model (un-prefixed names)."""
    return [r for r in history if ACC_MEAN in r]


def record(round: int, *parts: Mapping[str, Any], phase: str | None = None, prefix: str = "") -> dict[str, Any]:
    """The one builder of a committed step's record (metrics.jsonl) and timing (timings.jsonl), used by every phase:
    `round`, `phase` when given, then the keys of `parts` in their order, each under the phase's metric `prefix`
    (e.g. `expert0/`; "" keeps the plain names). Bytes go in as a part, `traffic(...)`."""
    out: dict[str, Any] = {ROUND: round}
    if phase is not None:
        out[PHASE] = phase
    for part in parts:
        out.update({f"{prefix}{k}": v for k, v in part.items()})
    return out


def traffic(up: int | None = None, down: int | None = None) -> dict[str, int]:
    """What a step sent, as a record part: `bytes_down` and `bytes_up`, those given."""
    return {k: v for k, v in ((BYTES_DOWN, down), (BYTES_UP, up)) if v is not None}


def without_prefix(record: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """A prefixed record under the plain names (for the summary): `prefix` removed from every key that has it."""
    n = len(prefix)
    return {k[n:] if k.startswith(prefix) else k: v for k, v in record.items()}


def query_totals(summary: Mapping[str, Any], setup: Mapping[str, Any]) -> dict[str, float]:
    """Bytes each way of every one-shot exchange: client queries (`query/<name>/bytes_*` in the summary) and setup
    stages (`setup/<stage>/bytes_*` in setup.json)."""
    total = {BYTES_UP: 0.0, BYTES_DOWN: 0.0}
    for source, first in ((summary, QUERY_PREFIX), (setup, SETUP_PREFIX)):
        for key, value in source.items():
            parts = key.split("/")
            if len(parts) >= 3 and f"{parts[0]}/" == first and parts[-1] in total:
                total[parts[-1]] += value
    return total
