{{/* Names and labels. */}}

{{/* The chart's name, or nameOverride. */}}
{{- define "agent.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of the release's objects: fullnameOverride, else RELEASE-NAME (RELEASE alone
when it contains NAME). */}}
{{- define "agent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "agent.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agent.labels" -}}
app.kubernetes.io/part-of: fleetwatch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The hub's addresses, comma-separated (--hub). Without them the agent cannot work: refuse
to render, naming the value and how to set it. The former default placeholder (kept by
`helm upgrade --reuse-values`) is no hub either. */}}
{{- define "agent.hubUrls" -}}
{{- $urls := .Values.hub.urls | default list -}}
{{- $how := "e.g. --set 'hub.urls={wss://hub.fleet.example.org:443}' (the hub's LoadBalancer address: kubectl -n fleetwatch-system get svc fleetwatch-hub in the control plane)" -}}
{{- if not $urls -}}
{{- fail (printf "hub.urls: the hub's wss address(es) the agent dials are required; %s" $how) -}}
{{- end -}}
{{- if has "wss://fleetwatch-hub.example.com:443" $urls -}}
{{- fail (printf "hub.urls: wss://fleetwatch-hub.example.com:443 is the chart's former placeholder, not a hub; %s" $how) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{- define "agent.selector" -}}
app.kubernetes.io/name: fleetwatch-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* repository@digest when image.digest is set (the tag is then ignored), else repository:tag. */}}
{{- define "agent.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The agent's ServiceAccount: the chart's, or one you made (serviceAccount.create=false). */}}
{{- define "agent.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "agent.fullname" .) }}
{{- else -}}
{{ required "serviceAccount.name: the ServiceAccount to use when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/* The scrape options of a monitor endpoint (metrics.serviceMonitor, metrics.podMonitor). */}}
{{- define "agent.endpointOptions" -}}
interval: {{ .interval }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- with .relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
