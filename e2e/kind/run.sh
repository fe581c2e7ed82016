#!/usr/bin/env bash
# gpusched on a kind cluster, for machines with Docker: create the cluster, build the three
# images from their Dockerfiles and load them, install the Helm chart, add simulated GPU nodes
# (kwok) whose topology the probe publishes from real `nvidia-smi topo -m` matrices, then run
# the demo jobs of docs/examples and wait for them.
#
#   e2e/kind/run.sh            # everything; KEEP=1 leaves the cluster up
#   e2e/kind/run.sh delete     # delete the cluster
#
# Needs kind, docker, kubectl and helm on PATH. Tested offline by tests/unit/test_kind_script.py
# (bash -n, shellcheck, and stub binaries checking every call it makes).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cluster=${KIND_CLUSTER:-gpusched}
namespace=${GPUSCHED_NAMESPACE:-gpusched-system}
tag=${GPUSCHED_TAG:-kind}
kwok_version=${KWOK_VERSION:-v0.8.0}
gpu_nodes=${GPU_NODES:-3}
fixture=${GPU_FIXTURE:-hgx-h100-sxm-8gpu-8nic}
components=(device-probe scheduler operator)

step() { echo "[kind] $*"; }
fail() { echo "[kind] error: $*" >&2; exit 1; }

for tool in kind docker kubectl helm; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done

if [ "${1:-}" = delete ]; then
  step "deleting cluster $cluster"
  kind delete cluster --name "$cluster"
  exit 0
fi
[ -f "$root/fixtures/topologies/$fixture.txt" ] || fail "no fixture $fixture in fixtures/topologies"

if kind get clusters | grep -qx "$cluster"; then
  step "cluster $cluster exists; reusing it"
else
  step "creating cluster $cluster"
  kind create cluster --name "$cluster" --config "$root/e2e/kind/cluster.yaml" --wait 180s
fi
kubeconfig=$(mktemp)
trap 'rm -f "$kubeconfig"' EXIT
kind get kubeconfig --name "$cluster" >"$kubeconfig"
export KUBECONFIG=$kubeconfig

for component in "${components[@]}"; do
  image="gpusched-$component:$tag"
  step "building $image from $component/Dockerfile"
  docker build --file "$root/$component/Dockerfile" --tag "$image" "$root"
  kind load docker-image --name "$cluster" "$image"
done

step "installing kwok $kwok_version (simulated GPU nodes)"
kubectl apply --server-side -f "https://github.com/kubernetes-sigs/kwok/releases/download/$kwok_version/kwok.yaml"
# gpusched's own pod and node life cycle (the local cluster's): pods run at once, honour
# sim.gpusched.io/runtime, and a deleted pod goes after its grace period.
kubectl apply --server-side -f "$root/src/gpusched/dev/localcluster/kwok-stages.yaml"
kubectl -n kube-system rollout status deployment/kwok-controller --timeout=180s

step "installing gpusched into $namespace"
helm upgrade --install gpusched "$root/deploy/helm/gpusched" \
  --namespace "$namespace" --create-namespace \
  --values "$root/e2e/kind/values.yaml" \
  --set "deviceProbe.image.repository=gpusched-device-probe,deviceProbe.image.tag=$tag" \
  --set "scheduler.extender.image.repository=gpusched-scheduler,scheduler.extender.image.tag=$tag" \
  --set "operator.image.repository=gpusched-operator,operator.image.tag=$tag" \
  --wait --timeout 10m

step "adding $gpu_nodes simulated GPU nodes ($fixture)"
for i in $(seq 1 "$gpu_nodes"); do
  node="gpu-sim-$i"
  kubectl apply --server-side -f - <<NODE
apiVersion: v1
kind: Node
metadata:
  name: $node
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    kubernetes.io/hostname: $node
    kubernetes.io/os: linux
    type: kwok
    gpusched.io/simulated: "true"
spec:
  # No taint: GpuJob pods land here through the operator's plan and gpusched's scheduler.
status:
  allocatable: {cpu: "96", memory: 1Ti, pods: "110", nvidia.com/gpu: "8"}
  capacity: {cpu: "96", memory: 1Ti, pods: "110", nvidia.com/gpu: "8"}
NODE
  # The probe's image, with the fake NVML reading a real matrix, publishes the node as the
  # DaemonSet would on a real GPU node (admin credentials: the own-node policy binds probe
  # tokens to the node their pod runs on, and these nodes run no pods of their own).
  docker run --rm --network host \
    --volume "$kubeconfig:/kubeconfig:ro" \
    --volume "$root/fixtures/topologies:/fixtures:ro" \
    "gpusched-device-probe:$tag" \
    --once --node "$node" --kubeconfig /kubeconfig --fake "/fixtures/$fixture.txt"
done

step "running the demo jobs of docs/examples"
kubectl apply -f "$root/docs/examples/namespaces.yaml"
kubectl apply -f "$root/docs/examples/priorityclasses.yaml"
kubectl apply -f "$root/docs/examples/tenantquotas.yaml"
kubectl apply -f "$root/docs/examples/gpujob-nvlink-4gpu.yaml"
kubectl apply -f "$root/docs/examples/gpujob-preemptible-2gpu.yaml"
kubectl wait gpujobs --all --all-namespaces --for=jsonpath='{.status.phase}'=Running --timeout=300s
kubectl get gpujobs --all-namespaces
helm test gpusched --namespace "$namespace" --timeout 5m || step "helm test failed (see above)"

if [ "${KEEP:-0}" = 1 ]; then
  step "cluster $cluster is up: kind get kubeconfig --name $cluster"
else
  step "deleting cluster $cluster (KEEP=1 keeps it)"
  kind delete cluster --name "$cluster"
fi
