{{/*
Chart name, overridable with nameOverride.
*/}}
{{- define "tern.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full resource name: fullnameOverride, else the release name if it already
contains the chart name, else <release>-<chart>. Kept to 52 characters so
suffixes such as "-management" stay within the 63-character name limit.
*/}}
{{- define "tern.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "tern.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels (stable across upgrades).
*/}}
{{- define "tern.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tern.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "tern.labels" -}}
helm.sh/chart: {{ include "tern.chart" . }}
{{ include "tern.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tern
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "tern.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tern.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Container image reference.
*/}}
{{- define "tern.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/*
Drain timeout as a .NET TimeSpan string ([d.]hh:mm:ss), from drainTimeoutSeconds.
*/}}
{{- define "tern.drainTimeout" -}}
{{- $s := int .Values.drainTimeoutSeconds }}
{{- $days := div $s 86400 }}
{{- $hms := printf "%02d:%02d:%02d" (mod (div $s 3600) 24) (mod (div $s 60) 60) (mod $s 60) }}
{{- if gt $days 0 }}
{{- printf "%d.%s" $days $hms }}
{{- else }}
{{- $hms }}
{{- end }}
{{- end }}

{{/*
Contents of the TERN_CONFIG file: values.config with values.reverseProxy
merged in as the "ReverseProxy" section.
*/}}
{{- define "tern.configJson" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- if .Values.reverseProxy }}
{{- $_ := set $cfg "ReverseProxy" (deepCopy .Values.reverseProxy) }}
{{- end }}
{{- toPrettyJson $cfg }}
{{- end }}

{{/*
Input checks; rendered (as nothing) by the Deployment.
*/}}
{{- define "tern.validate" -}}
{{- $drain := int .Values.drainTimeoutSeconds }}
{{- $sleep := int .Values.preStopSleepSeconds }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- if lt $drain 1 }}
{{- fail "drainTimeoutSeconds must be a positive number of seconds" }}
{{- end }}
{{- if lt $sleep 0 }}
{{- fail "preStopSleepSeconds must not be negative" }}
{{- end }}
{{- if le $grace (add $drain $sleep) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than preStopSleepSeconds + drainTimeoutSeconds (%d)" $grace (add $drain $sleep)) }}
{{- end }}
{{- if not (has (toString .Values.podAntiAffinity) (list "soft" "hard" "")) }}
{{- fail "podAntiAffinity must be \"soft\", \"hard\" or \"\"" }}
{{- end }}
{{- if and .Values.reverseProxy (not (kindIs "map" .Values.reverseProxy)) }}
{{- fail "reverseProxy must be a map (the YARP ReverseProxy section)" }}
{{- end }}
{{- if not (has (toString .Values.tls.clientCertificates.mode) (list "None" "Optional" "Required")) }}
{{- fail "tls.clientCertificates.mode must be \"None\", \"Optional\" or \"Required\"" }}
{{- end }}
{{- if and (ne (toString .Values.tls.clientCertificates.mode) "None") (not .Values.tls.clientCertificates.caSecretName) }}
{{- fail "tls.clientCertificates.caSecretName is required when tls.clientCertificates.mode is not None (a secret with the client CA certificates under ca.crt)" }}
{{- end }}
{{- if and .Values.config (not (kindIs "map" .Values.config)) }}
{{- fail "config must be a map (appsettings-format configuration)" }}
{{- end }}
{{- end }}
