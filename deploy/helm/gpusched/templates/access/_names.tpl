{{/* The annotations on pods only gpusched's identities write (gpusched.core.podgpus), as a CEL
list body. A unit test keeps it equal to gpusched.api.keys.OWNERSHIP_ANNOTATIONS. */}}
{{- define "gpusched.ownershipAnnotations" -}}
'gpusched.io/gpus', 'gpusched.io/gpu-indices', 'gpusched.io/topology-class', 'gpusched.io/allocated-gpus', 'gpusched.io/allocated-gpu-indices', 'gpusched.io/planned-node', 'gpusched.io/planned-gpu-indices'
{{- end -}}

{{/* The labels that say which GpuJob a pod belongs to, only the operator writes them, as a CEL
list body. A unit test keeps it equal to gpusched.api.keys.GPUJOB_POD_LABELS. */}}
{{- define "gpusched.gpujobPodLabels" -}}
'gpusched.io/job-name', 'gpusched.io/job-uid', 'gpusched.io/tenant', 'gpusched.io/replica-index', 'gpusched.io/admission'
{{- end -}}

{{/* A CEL expression: the pod `object` asks for GPUs in any container. */}}
{{- define "gpusched.celRequestsGpus" -}}
[has(object.spec.initContainers) ? object.spec.initContainers : [], object.spec.containers].exists(cs, cs.exists(c, has(c.resources) && ((has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || (has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests))))
{{- end -}}

{{/* A CEL expression: the GpuJob write is a creation, or an update that changes
spec.priorityClassName (set, changed or removed). Every other update (a label, an annotation
such as a workload's `gpusched.io/last-checkpoint`, the garbage collector removing a finalizer)
leaves the class as it was, so no rule on the class has anything to review: the class was
accepted when it was set, and a job stays editable after its tenant narrowed its classes.
oldObject is null on a creation; `||` never evaluates it there. */}}
{{- define "gpusched.celCreationOrNewPriorityClass" -}}
request.operation != 'UPDATE' || (has(object.spec.priorityClassName) ? object.spec.priorityClassName : '') != (has(oldObject.spec.priorityClassName) ? oldObject.spec.priorityClassName : '')
{{- end -}}
