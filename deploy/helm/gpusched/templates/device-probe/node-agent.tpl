{{/*
The node agent (gpusched's device plugin) as the second container of the probe DaemonSet
(nodeAgent.enabled). It runs as root without privileges: it creates its socket in the kubelet's
device-plugin directory and reads the kubelet's PodResources socket; it needs no GPU access (it
reads the probe's NodeGpuTopology, not NVML).
*/}}
{{- define "gpusched.nodeAgentContainer" -}}
{{- $v := .Values.nodeAgent }}
- name: node-agent
  image: {{ include "gpusched.image" (dict "ctx" $ "image" .Values.deviceProbe.image) }}
  imagePullPolicy: {{ .Values.deviceProbe.image.pullPolicy }}
  command: [gpusched, device-plugin]
  args:
  - --metrics-port={{ $v.metricsPort }}
  - --metrics-address=0.0.0.0
  - --device-plugin-dir={{ $v.kubeletDir }}/device-plugins
  - --pod-resources-socket={{ $v.kubeletDir }}/pod-resources/kubelet.sock
  {{- range $v.extraArgs }}
  - {{ . | quote }}
  {{- end }}
  env:
  - name: NODE_NAME
    valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
  ports:
  - name: agent-metrics
    containerPort: {{ $v.metricsPort }}
  resources: {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  volumeMounts:
  - {name: device-plugins, mountPath: {{ $v.kubeletDir }}/device-plugins}
  - {name: pod-resources, mountPath: {{ $v.kubeletDir }}/pod-resources, readOnly: true}
{{- end -}}

{{- define "gpusched.nodeAgentVolumes" -}}
- name: device-plugins
  hostPath: {path: {{ .Values.nodeAgent.kubeletDir }}/device-plugins, type: Directory}
- name: pod-resources
  hostPath: {path: {{ .Values.nodeAgent.kubeletDir }}/pod-resources, type: Directory}
{{- end -}}
