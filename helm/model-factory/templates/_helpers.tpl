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

{{/* The authenticating proxy's name and the labels its pods carry (the NetworkPolicy admits these). */}}
{{- define "mf.authProxy" -}}
{{- printf "%s-auth-proxy" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mf.authProxySelector" -}}
app.kubernetes.io/name: model-factory-auth-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The platform's TensorBoard (tensorboard.yaml): its name, the labels its pods carry, where it is
served (tensorboard.url, else behind the proxy at <platform.uiUrl><pathPrefix>, else nowhere known:
empty) and what it reads (the artifact store's models/ area, as ops/tensorboard_events.tensorboard_logdir
names it for the kubernetes profile's store: prefix "artifacts", pipelines/profiles.py). */}}
{{- define "mf.tensorboard" -}}
{{- printf "%s-tensorboard" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mf.tensorboardSelector" -}}
app.kubernetes.io/name: model-factory-tensorboard
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mf.tensorboardUrl" -}}
{{- if .Values.tensorboard.url -}}
{{- .Values.tensorboard.url | trimSuffix "/" -}}
{{- else if .Values.authProxy.enabled -}}
{{- printf "%s%s" (.Values.platform.uiUrl | trimSuffix "/") .Values.tensorboard.pathPrefix -}}
{{- end -}}
{{- end -}}

{{- define "mf.tensorboardLogdir" -}}
{{- printf "s3://%s/artifacts/models" (required "platform.artifactBucket is required" .Values.platform.artifactBucket) -}}
{{- end -}}
