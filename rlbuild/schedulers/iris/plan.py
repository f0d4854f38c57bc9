"""What the plan asks of Iris: the experiment's `execution.iris` settings, the resources the Iris executor plugin
reads from a rule (`iris_*`), the per-node sizes an Iris gang asks for, and Iris's line in the plan."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from rlbuild.core.validation import LABEL, StrictModel, node_size
from rlbuild.schedulers.base import JobRequest, NodeSize

PREFIX = "iris_"


class IrisSettings(StrictModel):
    """The experiment's `execution.iris`: where and how big its Iris jobs are. Placement: never part of an
    artifact's identity."""

    cluster: str = Field(min_length=1, max_length=63, pattern=LABEL)
    cpu: float = Field(gt=0, le=1024)
    memory: str
    disk: str
    priority: Literal["production", "interactive", "batch"] = "interactive"
    max_retries: int = Field(1, ge=0, le=100)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @field_validator("memory", "disk")
    @classmethod
    def _size(cls, value: str) -> str:
        return node_size(value)


def rule_resources(settings: IrisSettings | None, request: JobRequest) -> dict[str, int | str]:
    """The plugin's resources: a gang's per-node size and Iris's own settings where the experiment sets them, an
    export/eval job's size, and what the nodes run where they do not share this checkout's .venv (an image, or
    a set-up of the bundle's uv.lock with these extras)."""
    resources: dict[str, int | str] = {}
    if request.gang is None:
        resources |= {"iris_cpu": request.cpu or 1, "iris_memory": request.memory or ""}
    elif settings is not None:
        resources |= {
            "iris_cpu": int(settings.cpu),
            "iris_memory": settings.memory,
            "iris_disk": settings.disk,
            "iris_priority": settings.priority,
            "iris_max_retries": settings.max_retries,
        }
    if request.image:
        resources["iris_image"] = request.image
    elif request.extras:
        resources["iris_extras"] = ",".join(request.extras)
    return resources


def node_sizes(settings: IrisSettings | None) -> list[NodeSize]:
    if settings is None:
        return []
    return [
        NodeSize("execution.iris.cpu", "cpu", settings.cpu),
        NodeSize("execution.iris.memory", "memory", settings.memory),
        NodeSize("execution.iris.disk", "disk", settings.disk),
    ]


def plan_section(settings: IrisSettings | None) -> dict[str, Any]:
    names = ("cluster", "priority", "max_retries", "cpu", "memory", "disk")
    return {name: getattr(settings, name) if settings else None for name in names}


def plan_lines(section: dict[str, Any]) -> list[str]:
    where = f"cluster {section['cluster']}, priority {section['priority']}, retries {section['max_retries']}"
    size = f"per node cpu {section['cpu']}, memory {section['memory']}, disk {section['disk']}"
    return [f"  iris           {where}; {size}"]
