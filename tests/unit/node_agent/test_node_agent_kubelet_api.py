"""The kubelet API stubs are generated from the pinned upstream protos and never hand-edited."""

from __future__ import annotations

import shutil

import pytest

from gpusched.dev import kubeletapi


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go to locate the pinned module")
def test_committed_protos_and_stubs_match_the_pinned_kubelet_module() -> None:
    assert kubeletapi.problems() == []


def test_stubs_speak_the_kubelet_wire_names() -> None:
    from gpusched.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
    from gpusched.kubeletapi.podresources.v1 import api_pb2 as pr

    services = {
        service.full_name
        for module in (dp, pr)
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    assert services == {"v1beta1.Registration", "v1beta1.DevicePlugin", "v1.PodResourcesLister"}


def test_pinned_kubelet_api_is_the_control_plane_release() -> None:
    from gpusched.api.upstream import KUBERNETES_VERSION

    assert kubeletapi.pinned_version().removeprefix("v0.") == KUBERNETES_VERSION.removeprefix("v1.")
