{{/* Names and labels shared by every template. */}}
{{- define "trtfleet.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "trtfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "trtfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "trtfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trtfleet
{{- end -}}

{{- define "trtfleet.selector" -}}
app.kubernetes.io/name: {{ include "trtfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "trtfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Rules the operator needs in every namespace it manages (only the verbs it uses). */}}
{{- define "trtfleet.operatorRules" -}}
- apiGroups: [trtfleet.io]
  resources: [basemodels, adapters]
  verbs: [get, list, watch, patch, update]
- apiGroups: [trtfleet.io]
  resources: [basemodels/status, adapters/status]
  verbs: [get, patch, update]
- apiGroups: [trtfleet.io]
  resources: [basemodels/finalizers, adapters/finalizers]
  verbs: [update]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# patch: the autoscaler sets controller.kubernetes.io/pod-deletion-cost on serving pods before a scale-down
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- if include "trtfleet.pickerEnabled" . }}
# the BaseModels' InferencePools: server-side apply (create, patch); the garbage collector deletes them with their
# BaseModel
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [create, patch]
{{- end }}
{{- end -}}

{{- define "trtfleet.routerRules" -}}
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [trtfleet.io]
  resources: [basemodels, adapters, batches]
  verbs: [get, list, watch]
# policyConfig.tenancy.inferenceObjectives: a gateway's objectives name priority bands (read only where installed)
- apiGroups: [llm-d.ai]
  resources: [inferenceobjectives]
  verbs: [get, list, watch]
- apiGroups: [trtfleet.io]
  resources: [batches/status]
  verbs: [patch]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
{{- end -}}

{{/* The Secret of the internal bearer tokens (internalAuth): the user's, or the one the chart creates. */}}
{{- define "trtfleet.internalSecret" -}}
{{- .Values.internalAuth.existingSecret | default (printf "%s-internal" (include "trtfleet.fullname" .)) -}}
{{- end -}}

{{/* The labels the operator puts on every serving pod (trtfleet_operator/names.py). */}}
{{- define "trtfleet.servingSelector" -}}
app.kubernetes.io/component: serving
app.kubernetes.io/managed-by: trtfleet-operator
app.kubernetes.io/part-of: trtfleet
{{- end -}}

{{/* A NetworkPolicy peer: this release's pods of one component, in the release namespace (from anywhere). */}}
{{- define "trtfleet.componentPeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .root.Release.Namespace }}
  podSelector:
    matchLabels:
      {{- include "trtfleet.selector" . | nindent 6 }}
{{- end -}}

{{/* Peers allowed to a metrics port: the namespaces named for Prometheus, and any more peers given. */}}
{{- define "trtfleet.metricsPeers" -}}
{{- range .Values.networkPolicy.metricsNamespaces }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ . }}
{{- end }}
{{- with .Values.networkPolicy.metricsFrom }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Namespaces of the serving pods' NetworkPolicy: as given, else the operator's, else the release's. */}}
{{- define "trtfleet.servingNamespaces" -}}
{{- $names := .Values.networkPolicy.servingNamespaces | default .Values.operator.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson $names -}}
{{- end -}}

{{/* Whether the endpoint picker and the operator's InferencePools are on (gateway.inferencePool.enabled: true,
or auto and the cluster serves GIE's InferencePool CRD): "true", or empty. */}}
{{- define "trtfleet.pickerEnabled" -}}
{{- $on := toString .Values.gateway.inferencePool.enabled -}}
{{- if or (eq $on "true") (and (eq $on "auto") (.Capabilities.APIVersions.Has "inference.networking.k8s.io/v1/InferencePool")) -}}
true
{{- end -}}
{{- end -}}

{{/* The picker's Service, which every InferencePool's endpointPickerRef names (in the pool's namespace). */}}
{{- define "trtfleet.pickerService" -}}
{{- .Values.gateway.picker.service.name | default (printf "%s-epp" (include "trtfleet.fullname" .)) -}}
{{- end -}}

