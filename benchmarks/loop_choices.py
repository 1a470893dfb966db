"""Which `local.loop` each config's run takes under `local.loop: auto`, and why: the data and the setup stages are
built as `flsuite fit` builds them (GGEUR's augmentation included), then the run's choice is made; nothing trains.

    python benchmarks/loop_choices.py CONFIG [CONFIG ...]         # each CONFIG: "a.yaml" or "a.yaml+overlay.yaml"
"""

from __future__ import annotations

import sys

from flsuite.cli import federation_from_configs
from flsuite.federation.run_loop_choice import run_loop_choice
from flsuite.federation.state import FederationState


def choice_of(configs: list[str]) -> tuple[int, str]:
    federation = federation_from_configs(*configs)
    fed, _ = federation.build_data()
    return federation.rounds, run_loop_choice(federation, fed, FederationState.empty()).log_line()


def main() -> None:
    print("| config | rounds | choice |\n|---|---|---|")
    for arg in sys.argv[1:]:
        configs = arg.split("+")
        try:
            rounds, line = choice_of(configs)
        except Exception as e:  # noqa: BLE001 - report and go on (e.g. a dataset not on this machine)
            rounds, line = 0, f"not built here: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        print(f"| {' + '.join(configs)} | {rounds or ''} | {line} |", flush=True)


if __name__ == "__main__":
    main()
