"""Errors of the Iris executor, each naming the setting or resource, the value and the fix."""

from __future__ import annotations

from snakemake_interface_common.exceptions import WorkflowError


class IrisSettingError(WorkflowError):
    """A plugin setting or a rule resource cannot be turned into an Iris request."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: {fix}")
