"""The kubelet's gRPC APIs: device plugin ``v1beta1`` and PodResources ``v1``.

The ``.proto`` files are verbatim copies from the ``k8s.io/kubelet`` module pinned in
``e2e/tools/kubelet/go.mod``; the ``*_pb2*`` modules are generated from them by
``scripts/update-kubelet-api`` and never edited (a unit test fails when they are stale).
"""
