{{- define "larder.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "larder.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "larder.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "larder.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "larder.selectorLabels" -}}
app.kubernetes.io/name: {{ include "larder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "larder.labels" -}}
{{ include "larder.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "larder.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "larder.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "larder.credentialsSecret" -}}
{{- default (printf "%s-client-keys" (include "larder.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "larder.adminSecret" -}}
{{- default (printf "%s-admin" (include "larder.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{- define "larder.eventsSecret" -}}
{{- default (printf "%s-events" (include "larder.fullname" .)) .Values.events.existingSecret -}}
{{- end -}}

{{- define "larder.diskKeySecret" -}}
{{- default (printf "%s-disk-key" (include "larder.fullname" .)) .Values.disk.encryption.existingSecret -}}
{{- end -}}

{{- define "larder.fleetSecret" -}}
{{- default (printf "%s-fleet" (include "larder.fullname" .)) .Values.fleet.existingSecret -}}
{{- end -}}

{{- define "larder.fleetTlsSecret" -}}
{{- default (printf "%s-fleet-tls" (include "larder.fullname" .)) .Values.fleet.tls.existingSecret -}}
{{- end -}}

{{/* A TOML value: strings quoted, numbers and booleans as they are, lists inline. */}}
{{- define "larder.tomlValue" -}}
{{- if kindIs "string" . -}}
{{ . | quote }}
{{- else if kindIs "slice" . -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "larder.tomlValue" $v }}{{ end }}]
{{- else if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{ . }}
{{- end -}}
{{- end -}}
