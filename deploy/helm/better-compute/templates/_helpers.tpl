{{/* The chart's resource names: <release>-better-compute, unless the release already says it. */}}
{{- define "bc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "bc.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "api"). */}}
{{- define "bc.selector" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "bc.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The settings every command shares: the database, Temporal, logging. */}}
{{- define "bc.commonEnv" -}}
- name: BC_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret is required" .Values.database.existingSecret }}
      key: {{ .Values.database.key }}
- name: BC_TEMPORAL_ADDRESS
  value: {{ required "temporal.address is required" .Values.temporal.address | quote }}
- name: BC_TEMPORAL_NAMESPACE
  value: {{ .Values.temporal.namespace | quote }}
- name: BC_ROOT_TENANT
  value: {{ .Values.rootTenant | quote }}
- name: BC_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.temporal.tls.existingSecret }}
- name: BC_TEMPORAL_TLS_CERT
  value: /etc/better-compute/temporal/tls.crt
- name: BC_TEMPORAL_TLS_KEY
  value: /etc/better-compute/temporal/tls.key
- name: BC_TEMPORAL_TLS_CA
  value: /etc/better-compute/temporal/ca.crt
{{- with .Values.temporal.tls.serverName }}
- name: BC_TEMPORAL_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "bc.temporalVolumeMounts" -}}
{{- if .Values.temporal.tls.existingSecret -}}
- name: temporal-tls
  mountPath: /etc/better-compute/temporal
  readOnly: true
{{- end }}
{{- end -}}

{{- define "bc.temporalVolumes" -}}
{{- if .Values.temporal.tls.existingSecret -}}
- name: temporal-tls
  secret:
    secretName: {{ .Values.temporal.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "bc.iamURL" -}}
http://{{ include "bc.fullname" . }}-iam-host:{{ .Values.iamHost.port }}
{{- end -}}
