{{/* Names, labels and the shared pieces of the pod specs. */}}

{{- define "fleetwatch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetwatch.hub" -}}{{ include "fleetwatch.fullname" . }}-hub{{- end -}}
{{- define "fleetwatch.hubAdmin" -}}{{ include "fleetwatch.fullname" . }}-hub-admin{{- end -}}
{{- define "fleetwatch.lifecycle" -}}{{ include "fleetwatch.fullname" . }}-lifecycle{{- end -}}

{{- define "fleetwatch.labels" -}}
app.kubernetes.io/part-of: fleetwatch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleetwatch.hubSelector" -}}
app.kubernetes.io/name: fleetwatch-hub
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetwatch.lifecycleSelector" -}}
app.kubernetes.io/name: fleetwatch-lifecycle
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetwatch.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The in-cluster wss address of the hub (the lifecycle operator dials it). */}}
{{- define "fleetwatch.hubUrl" -}}
wss://{{ include "fleetwatch.hub" . }}.{{ .Release.Namespace }}.svc:{{ .Values.hub.service.port }}
{{- end -}}

{{- define "fleetwatch.runtimeNamespaces" -}}
{{- if .Values.lifecycle.runtimeNamespaces -}}
{{- join "," .Values.lifecycle.runtimeNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "fleetwatch.checks" -}}
{{- if not (has .Values.hub.bus (list "embedded" "nats")) -}}
{{- fail (printf "hub.bus must be embedded or nats, not %q" .Values.hub.bus) -}}
{{- end -}}
{{- if and (eq .Values.hub.bus "embedded") (gt (int .Values.hub.replicas) 1) -}}
{{- fail "hub.replicas > 1 needs hub.bus=nats: embedded hubs do not share their history" -}}
{{- end -}}
{{- if not (has .Values.certificates.mode (list "secret" "cert-manager")) -}}
{{- fail (printf "certificates.mode must be secret or cert-manager, not %q" .Values.certificates.mode) -}}
{{- end -}}
{{- if lt (int .Values.lifecycle.shards) 1 -}}
{{- fail "lifecycle.shards must be at least 1" -}}
{{- end -}}
{{- end -}}
