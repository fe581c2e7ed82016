"""Predicted run times survive an operator restart: the history is kept in a ConfigMap on the
real API server, written conditionally, and read back by the next operator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpusched.core.runtime import JobKind, Prediction
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.kube import api_client
from gpusched.kubeasync import AsyncApi
from gpusched.operator.runtimes import RuntimeBook

KIND = JobKind("team-a", "team-a-ns", "bert-ft", 8)
SMALL = JobKind("team-a", "team-a-ns", "resnet", 1)


@pytest.fixture
def namespace(kube: Any) -> Iterator[str]:
    name = f"runtimes-{int(time.time() * 1000) % 10**8}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name, grace_period_seconds=0)


def test_predictions_survive_an_operator_restart(kube: Any, namespace: str) -> None:
    async def scenario() -> None:
        api = AsyncApi(kube.configuration)
        try:
            first = RuntimeBook(api, namespace, save_interval=0)
            await first.load()
            assert first.history.predict(KIND) is None
            first.record("uid-1", KIND, 3600.0)
            first.record("uid-2", KIND, 5400.0)
            first.record("uid-2", KIND, 99999.0)  # the same run seen twice counts once
            assert await first.save()
            # A new operator (a restart, or another replica taking the lease) reads it back.
            second = RuntimeBook(api, namespace)
            await second.load()
            predicted = second.history.predict(KIND)
            assert predicted is not None
            assert (predicted.seconds, predicted.level) == (4500.0, 1)
            # It goes on recording; the first, now stale, loses the conditional write once and
            # then writes from a fresh read (only the leader records, so its history wins).
            second.save_interval = 0
            second.record("uid-3", KIND, 1800.0)
            assert await second.save()
            first.record("uid-4", KIND, 600.0)
            assert not await first.save()
            assert await first.save()
            third = RuntimeBook(api, namespace)
            await third.load()
            assert third.history.predict(KIND) == first.history.predict(KIND)
        finally:
            await api.close()

    asyncio.run(scenario())


def test_a_history_the_operator_may_not_read_yet_is_never_overwritten(
    kube: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    """A refused read (here a 403: the operator's Role not bound yet) leaves the persisted
    history alone: nothing is written until a read succeeds, and the runs recorded meanwhile
    are added on top of what was read."""
    other = f"{namespace}-own"
    editor = identities.namespace_editor(local_cluster, other)
    identity = api_client(editor)

    async def scenario() -> None:
        admin = AsyncApi(kube.configuration)
        api = AsyncApi(identity.configuration)
        try:
            earlier = RuntimeBook(admin, namespace, save_interval=0)
            await earlier.load()
            earlier.record("uid-1", KIND, 3600.0)
            assert await earlier.save()

            book = RuntimeBook(api, namespace, save_interval=0, read_retry=0)
            await book.load()
            assert not book.loaded
            book.record("uid-2", SMALL, 120.0)
            assert book.history.predict(SMALL) is not None
            assert not await book.save()
            persisted = RuntimeBook(admin, namespace)
            await persisted.load()
            assert persisted.history.predict(KIND) == Prediction(3600.0, 1)
            assert persisted.history.predict(SMALL) == Prediction(3600.0, 4)  # KIND's tenant

            local_cluster.kubectl(
                "create",
                "rolebinding",
                "history-reader",
                "--clusterrole=edit",
                f"--serviceaccount={other}:editor",
                "-n",
                namespace,
            )
            for _ in range(100):
                await book.load()
                if book.loaded:
                    break
                await asyncio.sleep(0.1)
            assert book.loaded
            assert book.history.predict(KIND) == Prediction(3600.0, 1)
            assert await book.save()
            after = RuntimeBook(admin, namespace)
            await after.load()
            assert after.history.predict(KIND) == Prediction(3600.0, 1)
            assert after.history.predict(SMALL) == Prediction(120.0, 1)
        finally:
            await api.close()
            await admin.close()

    try:
        asyncio.run(scenario())
    finally:
        identity.close()
        local_cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
