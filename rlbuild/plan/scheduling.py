"""The experiment's schedulers: each scheduler's `execution.<name>` section handed to that scheduler's package
(through the registry), for the checks, the rules' resources, the plan's lines and the launch document. Nothing
here knows a scheduler by name."""

from __future__ import annotations

from typing import Any

from rlbuild.contracts.recipe import Recipe
from rlbuild.core.errors import Violation
from rlbuild.plan.spec import Experiment, scheduler_settings
from rlbuild.schedulers.base import Gang, JobRequest, PlanFacts, Scheduler
from rlbuild.schedulers.registry import SCHEDULERS


def gang_of(experiment: Experiment) -> Gang:
    t = experiment.topology
    return Gang(t.num_nodes, t.gpus_per_node, t.gpu_variant)


def plan_facts(experiment: Experiment, recipe: Recipe, step_time_s: float | None = None) -> PlanFacts:
    t = recipe.trainer
    return PlanFacts(gang_of(experiment), t.max_steps, t.ckpt_interval, step_time_s)


def _each(experiment: Experiment) -> list[tuple[type[Scheduler], Any]]:
    """Every scheduler with the experiment's section for it (None where it sets none)."""
    return [(cls, getattr(experiment.execution, name, None)) for name, cls in SCHEDULERS.items()]


def problems(experiment: Experiment, recipe: Recipe, step_time_s: float | None = None) -> list[Violation]:
    """What each scheduler finds wrong with its own section, without asking it."""
    out = []
    facts = plan_facts(experiment, recipe, step_time_s)
    for cls, settings in _each(experiment):
        out += cls.problems(settings, facts)
    return out


def cluster_problems(experiment: Experiment) -> list[Violation]:
    """What each scheduler the experiment names says itself (asked by the submitting process only)."""
    gang = gang_of(experiment)
    return [
        v for cls, settings in _each(experiment) if settings is not None for v in cls.cluster_problems(settings, gang)
    ]


def sized_by_step_time(experiment: Experiment) -> bool:
    """Whether a scheduler the experiment sets sizes its jobs by the training's step time (a chain of jobs)."""
    return any(cls.sized_by_step_time for cls, settings in _each(experiment) if settings is not None)


def declared_step_time(experiment: Experiment) -> tuple[float, str] | None:
    """(seconds per step, the field that says so) where a scheduler's section states a step time."""
    for cls, settings in _each(experiment):
        declared = cls.declared_step_time(settings)
        if declared is not None:
            return declared, f"execution.{cls.name}"
    return None


def rule_resources(experiment: Experiment, request: JobRequest) -> dict[str, int | str]:
    """What every scheduler's executor reads for one rule's job (each keeps only its own; workflow.py drops the
    others' under an executor)."""
    resources: dict[str, int | str] = {}
    for cls, settings in _each(experiment):
        resources |= cls.rule_resources(settings, request)
    return resources


def plan_sections(experiment: Experiment, facts: PlanFacts, executor: str | None) -> dict[str, dict[str, Any]]:
    """Each scheduler's part of the plan, for the executor that runs the jobs (None: a cluster executor not known
    yet, as in a cluster dry run or the plan file a rule writes: every scheduler's part)."""
    sections = {}
    for cls, settings in _each(experiment):
        if executor is not None and not cls.runs_under(executor):
            continue
        section = cls.plan_section(settings, facts)
        if section is not None:
            sections[cls.name] = section
    return sections


def plan_lines(sections: dict[str, dict[str, Any]], facts: PlanFacts) -> list[str]:
    return [line for name, section in sections.items() for line in SCHEDULERS[name].plan_lines(section, facts)]


def launch_settings(experiment: Experiment) -> dict[str, dict[str, Any]]:
    """Each scheduler's section the experiment sets, as the launch document records it."""
    return {
        name: SCHEDULERS[name].launch_settings(value)
        for name, value in scheduler_settings(experiment.execution).items()
    }
