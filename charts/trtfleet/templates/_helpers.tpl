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
{{- end -}}

{{- define "trtfleet.routerRules" -}}
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [trtfleet.io]
  resources: [basemodels, adapters, batches]
  verbs: [get, list, watch]
- apiGroups: [trtfleet.io]
  resources: [batches/status]
  verbs: [patch]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
{{- end -}}
