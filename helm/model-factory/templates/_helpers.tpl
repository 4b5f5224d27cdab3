{{/* The training namespace: values.trainingNamespace.name, else the release namespace. */}}
{{- define "mf.namespace" -}}
{{- default .Release.Namespace .Values.trainingNamespace.name -}}
{{- end -}}

{{- define "mf.labels" -}}
app.kubernetes.io/name: model-factory
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mf.launcherRole" -}}
{{- printf "%s-launcher" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
