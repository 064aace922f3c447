{{/* Fixed names: one instance per cluster (cluster-wide CRDs, ClusterRole and summaries; one Lease). */}}
{{- define "nws.name" -}}node-workload-summary{{- end }}

{{- define "nws.labels" -}}
app.kubernetes.io/name: {{ include "nws.name" . }}
{{- end }}
