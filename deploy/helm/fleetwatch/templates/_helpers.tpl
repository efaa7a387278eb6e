{{/* Names, labels and the shared pieces of the pod specs. */}}

{{/* The chart's name, or nameOverride. */}}
{{- define "fleetwatch.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: fullnameOverride, else RELEASE-NAME (RELEASE alone
when it contains NAME). 50 characters leave room for the longest suffix (-relay-webhook...). */}}
{{- define "fleetwatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "fleetwatch.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
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
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "fleetwatch.hubSelector" -}}
app.kubernetes.io/name: fleetwatch-hub
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetwatch.lifecycleSelector" -}}
app.kubernetes.io/name: fleetwatch-lifecycle
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* repository@digest when image.digest is set (the tag is then ignored), else repository:tag. */}}
{{- define "fleetwatch.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The ServiceAccounts the pods run as: the chart's, or one you made (create=false). */}}
{{- define "fleetwatch.hubServiceAccount" -}}
{{- if .Values.hub.serviceAccount.create -}}
{{ .Values.hub.serviceAccount.name | default (include "fleetwatch.hub" .) }}
{{- else -}}
{{ required "hub.serviceAccount.name: the ServiceAccount to use when hub.serviceAccount.create=false" .Values.hub.serviceAccount.name }}
{{- end -}}
{{- end -}}
{{- define "fleetwatch.lifecycleServiceAccount" -}}
{{- if .Values.lifecycle.serviceAccount.create -}}
{{ .Values.lifecycle.serviceAccount.name | default (include "fleetwatch.lifecycle" .) }}
{{- else -}}
{{ required "lifecycle.serviceAccount.name: the ServiceAccount to use when lifecycle.serviceAccount.create=false" .Values.lifecycle.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/*
What a workload's pod spec takes from its values (hub, lifecycle, relays.*): priority class,
node selection and scheduling. With more than one replica and no affinity or
topologySpreadConstraints of your own, the replicas prefer different nodes and spread over
zones (both soft: a single-node or single-zone cluster still schedules them).
Call with (dict "v" .Values.hub "replicas" N "selector" (include "...Selector" .)).
*/}}
{{- define "fleetwatch.scheduling" -}}
{{- with .v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .v.affinity }}
affinity:
  {{- toYaml .v.affinity | nindent 2 }}
{{- else if gt (int .replicas) 1 }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- .selector | nindent 14 }}
{{- end }}
{{- if .v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .v.topologySpreadConstraints | nindent 2 }}
{{- else if gt (int .replicas) 1 }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- .selector | nindent 8 }}
{{- end }}
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

{{- /* The namespace of Runtimes' kubeconfig Secrets: never the release namespace, whose
Secrets (hub TLS key, admin token, CA) the operator must not read. */ -}}
{{- define "fleetwatch.kubeconfigNamespace" -}}
{{- $ns := required "lifecycle.runtimeKubeconfigs.namespace: the namespace of the runtime clusters' kubeconfig Secrets" .Values.lifecycle.runtimeKubeconfigs.namespace -}}
{{- if eq $ns .Release.Namespace -}}
{{- fail (printf "lifecycle.runtimeKubeconfigs.namespace %q is the release namespace: the operator would read the hub's TLS key, admin token and CA there; name a namespace that holds kubeconfigs only" $ns) -}}
{{- end -}}
{{- $ns -}}
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

{{- define "fleetwatch.testImage" -}}
{{- with .Values.tests.image -}}
{{ .repository }}{{ if .digest }}@{{ .digest }}{{ else }}:{{ .tag }}{{ end }}
{{- end -}}
{{- end -}}

{{/* A relay's workload name, selector and ServiceAccount. Call with (dict "kind" "webhook" "root" $). */}}
{{- define "fleetwatch.relay" -}}{{ include "fleetwatch.fullname" .root }}-relay-{{ .kind }}{{- end -}}
{{- define "fleetwatch.relaySelector" -}}
app.kubernetes.io/name: fleetwatch-relay-{{ .kind }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}
{{- define "fleetwatch.relayServiceAccount" -}}
{{- $r := index .root.Values.relays .kind -}}
{{- if $r.serviceAccount.create -}}
{{ $r.serviceAccount.name | default (include "fleetwatch.relay" .) }}
{{- else -}}
{{ required (printf "relays.%s.serviceAccount.name: the ServiceAccount to use when relays.%s.serviceAccount.create=false" .kind .kind) $r.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/*
What an enabled relay cannot do without: a target URL, a subscriber name no other grant of
the access policy uses (a name granted twice makes the policy invalid and the hub not
ready), at least one cluster in its grant. Call with (dict "kind" "webhook" "r" $r "Values" $.Values).
*/}}
{{- define "fleetwatch.relayChecks" -}}
{{- $p := printf "relays.%s" .kind -}}
{{- if not .r.target -}}
{{- fail (printf "%s.target: the URL the %s relay sends events to is required when %s.enabled=true (e.g. --set %s.target=https://receiver.example/events)" $p .kind $p $p) -}}
{{- end -}}
{{- if not (regexMatch "^https?://[^/]+" .r.target) -}}
{{- fail (printf "%s.target %q must be an http:// or https:// URL" $p .r.target) -}}
{{- end -}}
{{- if .Values.hub.accessPolicy.enabled -}}
{{- if not .r.clusters -}}
{{- fail (printf "%s.clusters: the access-policy grant of subscriber %q needs at least one cluster glob (\"*\" for all)" $p .r.name) -}}
{{- end -}}
{{- range .Values.hub.accessPolicy.subscribers -}}
{{- if eq .name $.r.name -}}
{{- fail (printf "%s.name %q is already granted in hub.accessPolicy.subscribers: the chart adds the relay's grant from %s.clusters; remove that entry or pick another name" $p $.r.name $p) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.relays.webhook.enabled .Values.relays.klm.enabled (eq .Values.relays.webhook.name .Values.relays.klm.name) -}}
{{- fail (printf "relays.webhook.name and relays.klm.name are both %q: each relay needs its own subscriber name" .r.name) -}}
{{- end -}}
{{- if and .r.targetTLS.clientSecretName (not .r.targetTLS.caSecretName) -}}
{{- fail (printf "%s.targetTLS.clientSecretName needs %s.targetTLS.caSecretName (--target-cert needs --target-ca)" $p $p) -}}
{{- end -}}
{{- end -}}

{{/* The port of a relay's target URL (egress NetworkPolicy): explicit, else 443 / 80. */}}
{{- define "fleetwatch.relayTargetPort" -}}
{{- $u := urlParse . -}}
{{- $hostport := splitList ":" $u.host -}}
{{- if gt (len $hostport) 1 -}}
{{ last $hostport }}
{{- else if eq $u.scheme "https" -}}
443
{{- else -}}
80
{{- end -}}
{{- end -}}

{{/* The subscribers of the access policy: hub.accessPolicy.subscribers plus a grant for each enabled relay. */}}
{{- define "fleetwatch.accessPolicySubscribers" -}}
{{- $subs := required "hub.accessPolicy.subscribers: name at least the lifecycle operator" .Values.hub.accessPolicy.subscribers -}}
{{- range $kind := list "webhook" "klm" -}}
{{- $r := index $.Values.relays $kind -}}
{{- if $r.enabled -}}
{{- $subs = append $subs (dict "name" $r.name "clusters" $r.clusters) -}}
{{- end -}}
{{- end -}}
{{- toYaml $subs -}}
{{- end -}}

{{/* The scrape options of a ServiceMonitor endpoint (monitoring.serviceMonitor). */}}
{{- define "fleetwatch.endpointOptions" -}}
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
