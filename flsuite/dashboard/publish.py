"""A comparison (`flsuite compare`, `experiments/study.py`) published as a W&B report, or its spec written next to
compare.md when W&B is offline (no API key, WANDB_MODE=offline)."""

from __future__ import annotations

from pathlib import Path

from flsuite.compare.report import Comparison
from flsuite.dashboard import spec
from flsuite.dashboard.plan import StudyReport, study_report
from flsuite.tracking import WandbConfig, _resolve_wandb_mode

#: The report's spec file, next to compare.md.
REPORT_FILE = "wandb_report.json"


def comparison_report(comparison: Comparison, title: str, command: str) -> StudyReport:
    """The comparison's report over its runs' W&B groups (each run's `name`) under the runs' last-k prefix."""
    runs = [run for g in comparison.groups for run in g.runs]
    groups = sorted({str(run.config["name"]) for run in runs if run.config.get("name")})
    return study_report(title, comparison.markdown(title), command, groups, runs[0].prefix)


def wandb_project(comparison: Comparison) -> tuple[str, str | None]:
    """The W&B project and entity the runs were logged to (their configs' `wandb.*`; flsuite's defaults)."""
    configs = [run.config.get("wandb") or {} for g in comparison.groups for run in g.runs]
    default = WandbConfig()
    return str(configs[0].get("project") or default.project), configs[0].get("entity") or default.entity


def publish(
    comparison: Comparison,
    title: str,
    command: str,
    spec_file: Path | None,
    project: str | None = None,
    entity: str | None = None,
) -> str:
    """Save the comparison's report (returns its URL), or, offline, write its spec to `spec_file` (returns the path)."""
    spec.require_library()
    study = comparison_report(comparison, title, command)
    run_project, run_entity = wandb_project(comparison)
    project, entity = project or run_project, entity or run_entity
    if _resolve_wandb_mode("auto") == "offline":
        if spec_file is None:
            raise ValueError(
                "W&B is offline, so the report is written as a spec next to compare.md: "
                f"give --out (it writes {REPORT_FILE})"
            )
        return str(spec.write_spec(spec.report(study, entity or "", project), spec_file))
    if entity is None:
        import wandb

        entity = str(wandb.Api().default_entity)
    return spec.save(spec.report(study, entity, project))
