"""A plan (`flsuite.dashboard.plan`) as W&B's own objects: a `wandb_workspaces` Workspace or Report, its spec as
JSON (offline, no network), read back, and saved (the only step that reaches the server).

Decisions:
- `wandb-workspaces` is an optional extra, pinned (its API is W&B's "Public Preview"): `require_library` says which
  extra to install before any work, and the library is imported only when a spec is built, because `flsuite fit`
  imports every flsuite module at start-up and the library (with wandb) costs about a second.
- A spec file is `{"kind": "workspace" | "report", "spec": <the library's own model, as saved>}`, so it reads
  back through the library's model (`_from_model`) exactly as a saved view or report would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from flsuite.dashboard.panels import Bars, Curves, Importance, Panel, Parallel, Scalar
from flsuite.dashboard.plan import RunFilter, StudyReport, View
from flsuite.records import ROUND

if TYPE_CHECKING:
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

#: The extra that carries the library, named in the error when it is missing.
EXTRA = "dashboard"
INSTALL = f'pip install "flsuite[{EXTRA}]"'
#: W&B's run attribute for the method label flsuite gives every run (`job_type`).
JOB_TYPE = "JobType"
SpecKind = Literal["workspace", "report"]


class MissingExtraError(ImportError):
    """`wandb-workspaces` is not installed."""


def require_library() -> None:
    """Stop, naming the extra, when `wandb-workspaces` is not installed."""
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError as err:
        raise MissingExtraError(f"W&B dashboards need the optional package wandb-workspaces: {INSTALL}") from err


def _run_filters(runs: RunFilter) -> list:
    import wandb_workspaces.expr as expr

    out = []
    if runs.group is not None:
        out.append(expr.Metric("Group") == runs.group)
    if runs.tag is not None:
        out.append(expr.Tags().isin([runs.tag]))
    if runs.sweep is not None:
        out.append(expr.Metric("Sweep") == runs.sweep)
    return out


def panel(p: Panel, by_method: bool = True) -> wr.interface.PanelTypes:
    """One panel of the plan as the library's panel, grouped by method (`job_type`) when `by_method`."""
    import wandb_workspaces.reports.v2 as wr

    groupby = wr.Metric(JOB_TYPE) if by_method else None
    agg: Literal["mean"] | None = "mean" if by_method else None
    spread: Literal["stddev"] | None = "stddev" if by_method else None
    if isinstance(p, Curves):
        return wr.LinePlot(
            title=p.title,
            x=ROUND,
            y=list(p.keys),
            metric_regex=p.regex,
            title_x=ROUND,
            groupby=groupby,
            groupby_aggfunc=agg,
            groupby_rangefunc=spread,
        )
    if isinstance(p, Bars):
        return wr.BarPlot(
            title=p.title,
            metrics=list(p.keys),
            orientation="v",
            groupby=groupby,
            groupby_aggfunc=agg,
            groupby_rangefunc=spread,
        )
    if isinstance(p, Scalar):
        return wr.ScalarChart(title=p.title, metric=p.key, groupby_aggfunc="mean", groupby_rangefunc="stddev")
    if isinstance(p, Parallel):
        columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in p.config_keys]
        return wr.ParallelCoordinatesPlot(
            title=p.title, columns=[*columns, wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(p.metric))]
        )
    if isinstance(p, Importance):
        return wr.ParameterImportancePlot(with_respect_to=p.metric)
    raise TypeError(f"not a dashboard panel: {p!r}")


def workspace(view: View, entity: str, project: str) -> ws.Workspace:
    """The view as a W&B workspace of `entity/project`: x-axis `round`, runs filtered and grouped by method."""
    import wandb_workspaces.expr as expr
    import wandb_workspaces.workspaces as ws

    sections = [
        ws.Section(name=s.name, panels=[panel(p, view.by_method) for p in s.panels], is_open=True)
        for s in view.sections
    ]
    runset = ws.RunsetSettings(
        filters=_run_filters(view.runs), groupby=[expr.Metric(JOB_TYPE)] if view.by_method else []
    )
    return ws.Workspace(
        entity=entity,
        project=project,
        name=view.name,
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis=ROUND),
        runset_settings=runset,
    )


def report(study: StudyReport, entity: str, project: str) -> wr.Report:
    """The study as a W&B report: its tables, its panels over the runs of its groups (by method), the command."""
    import wandb_workspaces.expr as expr
    import wandb_workspaces.reports.v2 as wr

    filters = [expr.Metric("Group").isin(list(study.groups))] if study.groups else []
    runset = wr.Runset(entity=entity, project=project, name=study.title[:64], filters=filters, groupby=["run.jobType"])
    return wr.Report(
        entity=entity,
        project=project,
        title=study.title[:128],
        description="flsuite compare",
        blocks=[
            wr.MarkdownBlock(text=study.markdown),
            wr.PanelGrid(runsets=[runset], panels=[panel(p) for p in study.panels]),
            wr.H2(text="Regenerate"),
            wr.MarkdownBlock(text=f"```bash\n{study.command}\n```"),  # the library's code blocks know no shell
        ],
    )


def to_spec(obj: ws.Workspace | wr.Report) -> dict:
    """The object's spec file content (see the module's decisions)."""
    import wandb_workspaces.workspaces as ws

    kind: SpecKind = "workspace" if isinstance(obj, ws.Workspace) else "report"
    return {"kind": kind, "spec": obj._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")}


def from_spec(spec: dict) -> ws.Workspace | wr.Report:
    """A spec file's content read back through the library's model."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.reports.v2.internal as report_model
    import wandb_workspaces.workspaces as ws
    import wandb_workspaces.workspaces.internal as workspace_model

    if spec["kind"] == "workspace":
        return ws.Workspace._from_model(workspace_model.View.model_validate(spec["spec"]))
    if spec["kind"] == "report":
        return wr.Report._from_model(report_model.ReportViewspec.model_validate(spec["spec"]))
    raise ValueError(f"unknown dashboard spec kind {spec['kind']!r} (workspace or report)")


def write_spec(obj: ws.Workspace | wr.Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_spec(obj), indent=1) + "\n")
    return path


def save(obj: ws.Workspace | wr.Report) -> str:
    """Save to W&B (network, an API key) and return the URL."""
    obj.save()
    return str(obj.url)
