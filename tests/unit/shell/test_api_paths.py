"""The one client refuses API paths a name from outside could have bent."""

from __future__ import annotations

import pytest

from gpusched.kubeasync import _check_path


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/ns/pods/../../nodes/n1",
        "/api/v1/namespaces/ns/pods/%2e%2E/x",
        "/api/v1/namespaces/ns/pods/./x",
        "/api/v1/namespaces//pods",
        "/api/v1/namespaces/ns/pods/p#frag",
        "/api/v1/namespaces/ns/pods/p q",
        "api/v1/pods",
    ],
)
def test_bent_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="refusing"):
        _check_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/ns/pods/train-1-0",
        "/apis/gpusched.io/v1alpha1/namespaces/ns/gpujobs/a.b-c/status",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
    ],
)
def test_real_paths_pass(path: str) -> None:
    _check_path(path)
