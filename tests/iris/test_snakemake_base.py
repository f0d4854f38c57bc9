"""Snakemake's own executor test base (the `simple` and `groups` workflows) against the plugin and a real local
Iris cluster, with local storage and with S3 (moto on loopback)."""

from __future__ import annotations

import pytest
from snakemake.common.tests import TestWorkflowsLocalStorageBase, TestWorkflowsMinioPlayStorageBase
from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from rlbuild.dev.s3 import S3Server
from rlbuild.schedulers.iris.localcluster import LocalIris
from snakemake_executor_plugin_iris import ExecutorSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class IrisExecutor:
    url = ""

    @pytest.fixture(autouse=True)
    def _cluster(self, iris: LocalIris) -> None:
        type(self).url = iris.url

    def get_executor(self) -> str:
        return "iris"

    def get_executor_settings(self) -> ExecutorSettingsBase:
        return ExecutorSettings(controller_url=self.url, cpu_pool="cpu", status_interval=1)


class TestLocalStorage(IrisExecutor, TestWorkflowsLocalStorageBase):
    __test__ = True


class TestS3Storage(IrisExecutor, TestWorkflowsMinioPlayStorageBase):
    __test__ = True
    endpoint = ""

    @pytest.fixture(autouse=True)
    def _s3(self, s3_server: S3Server) -> None:
        type(self).endpoint = s3_server.endpoint

    @property
    def endpoint_url(self) -> str:
        return self.endpoint

    @property
    def access_key(self) -> str:
        return s3_key("AWS_ACCESS_KEY_ID")

    @property
    def secret_key(self) -> str:
        return s3_key("AWS_SECRET_ACCESS_KEY")


def s3_key(name: str) -> str:
    return S3Server(endpoint="").env()[name]
