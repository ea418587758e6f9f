{{/*
Names, labels and identities shared by every template.
Helmhive is one per cluster: the admission policies, the Envelopes and the webhook
configuration `helmhive.dev` are cluster-scoped and named by the operator, not by the release.
*/}}

{{/* The chart's name, `helmhive` unless nameOverride says otherwise. */}}
{{- define "helmhive.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name: fullnameOverride, else the release name when it already holds the
chart's name (`helm install helmhive ...` gives `helmhive`), else `<release>-<chart>`.
*/}}
{{- define "helmhive.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "helmhive.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object. `app.kubernetes.io/name` and `part-of` are the ones the operator's
own manifests (helmhive.deploy.manifests) carry; the rest are Helm's recommended labels.
*/}}
{{- define "helmhive.labels" -}}
app.kubernetes.io/name: {{ include "helmhive.name" . }}
app.kubernetes.io/part-of: helmhive
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "helmhive.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator pods' selector (immutable once installed). */}}
{{- define "helmhive.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "helmhive.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* commonAnnotations as a YAML map body, or nothing. */}}
{{- define "helmhive.annotations" -}}
{{- with .Values.commonAnnotations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* The operator's ServiceAccount: its own name, the RBAC subject and the identity the policies trust. */}}
{{- define "helmhive.serviceAccountName" -}}
{{- if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.create }}
{{- printf "%s-operator" (include "helmhive.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- fail "serviceAccount.name: required when serviceAccount.create is false (the admission policies trust exactly this ServiceAccount)" }}
{{- end }}
{{- end }}

{{/* The user name the API server gives the operator; the envelope and audit policies allow only it. */}}
{{- define "helmhive.operatorUsername" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "helmhive.serviceAccountName" . }}
{{- end }}

{{- define "helmhive.operator.name" -}}
{{- printf "%s-operator" (include "helmhive.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "helmhive.webhook.serviceName" -}}
{{- printf "%s-webhook" (include "helmhive.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "helmhive.webhook.secretName" -}}
{{- printf "%s-webhook-tls" (include "helmhive.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "helmhive.metrics.serviceName" -}}
{{- printf "%s-metrics" (include "helmhive.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: a digest wins, an empty tag is the
chart's appVersion. Call with (dict "image" .Values.operator.image "context" $).
*/}}
{{- define "helmhive.image" -}}
{{- $image := .image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .context.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* Whether to render the ServiceMonitor: `true`, or `auto` and the Prometheus Operator's API is served. */}}
{{- define "helmhive.serviceMonitor.enabled" -}}
{{- $mode := toString .Values.metrics.serviceMonitor.enabled }}
{{- if and .Values.metrics.enabled (or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor"))) }}
{{- "true" }}
{{- end }}
{{- end }}
