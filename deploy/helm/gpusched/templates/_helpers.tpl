{{/* Chart name, overridable. */}}
{{- define "gpusched.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every resource name: the release name, unless it already contains the chart's. */}}
{{- define "gpusched.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpusched.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpusched.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries; `component` is added per component. */}}
{{- define "gpusched.labels" -}}
helm.sh/chart: {{ include "gpusched.chart" . }}
app.kubernetes.io/name: {{ include "gpusched.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpusched
{{- end -}}

{{/* Labels of one component's objects: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "gpusched.componentLabels" -}}
{{ include "gpusched.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Pod selector of one component. */}}
{{- define "gpusched.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpusched.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Names of the identities (ServiceAccounts) and of what belongs to them. */}}
{{- define "gpusched.probe" -}}{{ include "gpusched.fullname" . }}-device-probe{{- end -}}
{{- define "gpusched.kubeScheduler" -}}{{ include "gpusched.fullname" . }}-scheduler{{- end -}}
{{- define "gpusched.extender" -}}{{ include "gpusched.fullname" . }}-extender{{- end -}}
{{- define "gpusched.operator" -}}{{ include "gpusched.fullname" . }}-operator{{- end -}}

{{/* The username a ServiceAccount token authenticates as: (dict "ctx" $ "name" "...") */}}
{{- define "gpusched.saUser" -}}
system:serviceaccount:{{ .ctx.Release.Namespace }}:{{ .name }}
{{- end -}}

{{/* image reference: (dict "ctx" $ "image" .Values.x.image) */}}
{{- define "gpusched.image" -}}
{{ .image.repository }}:{{ .image.tag | default .ctx.Chart.AppVersion }}
{{- end -}}

{{/* The PriorityClass of gpusched's pods, or nothing. */}}
{{- define "gpusched.priorityClassName" -}}
{{- if .Values.priorityClass.create -}}
{{ .Values.priorityClass.name | default (printf "%s-system" (include "gpusched.fullname" .)) }}
{{- else -}}
{{ .Values.priorityClass.name }}
{{- end -}}
{{- end -}}

{{/* Pod fields shared by every component: (dict "ctx" $ "values" .Values.operator) */}}
{{- define "gpusched.podCommon" -}}
{{- with include "gpusched.priorityClassName" .ctx }}
priorityClassName: {{ . }}
{{- end }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A container security context for gpusched's Python processes. */}}
{{- define "gpusched.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The node labels the device probe publishes (gpusched.core.labels), as a CEL list body. */}}
{{- define "gpusched.probeLabels" -}}
{{- $own := list "probed" "gpu.count" "gpu.healthy" "gpu.model" "nvlink.islands" "nvlink.largest-island" "nvswitch" "numa.nodes" "topology.hash" -}}
{{- $gfd := list "gpu.product" "gpu.count" "gpu.memory" "gpu.family" "gpu.compute.major" "gpu.compute.minor" "cuda.driver-version.major" "cuda.driver-version.minor" "cuda.driver-version.revision" "cuda.driver-version.full" "cuda.runtime-version.major" "cuda.runtime-version.minor" "cuda.runtime-version.full" "mig.capable" "gpu.clique" -}}
{{- range $i, $k := $own }}{{ if $i }}, {{ end }}'gpusched.io/{{ $k }}'{{ end -}}
{{- range $gfd }}, 'nvidia.com/{{ . }}'{{ end -}}
{{- end -}}

{{/* The Secret holding the operator webhook's certificate. */}}
{{- define "gpusched.webhookSecret" -}}
{{- .Values.operator.webhook.certificateSecret | default (printf "%s-webhook-certificate" (include "gpusched.operator" .)) -}}
{{- end -}}
