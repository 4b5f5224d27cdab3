{{/* Kueue (values.kueue): names shared by the ClusterQueues, LocalQueues and the ConfigMap. */}}

{{/* The ClusterQueue and LocalQueue name of one team: (dict "root" $ "team" "<team>"). */}}
{{- define "mf.kueueQueueName" -}}
{{- printf "%s%s" .root.Values.kueue.queuePrefix (.team | replace "_" "-") -}}
{{- end -}}

{{/* team=localqueue,... as resources/k8s/kueue.py parse_queues reads it. */}}
{{- define "mf.kueueQueues" -}}
{{- $root := . -}}
{{- $pairs := list -}}
{{- range .Values.kueue.teams -}}
{{- $pairs = append $pairs (printf "%s=%s" .name (include "mf.kueueQueueName" (dict "root" $root "team" .name))) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* The scheduler training pods use: the bin-packing profile's when it is on, else none. */}}
{{- define "mf.schedulerName" -}}
{{- if .Values.binPackingScheduler.enabled -}}
{{- .Values.binPackingScheduler.schedulerName -}}
{{- end -}}
{{- end -}}
