{{/* Fixed names: one instance per cluster (cluster-wide CRDs, ClusterRole and summaries; one Lease). */}}
{{- define "nws.name" -}}node-workload-summary{{- end }}

{{- define "nws.labels" -}}
app.kubernetes.io/name: {{ include "nws.name" . }}
{{- end }}

{{/* The certificate Secret, when the metrics are secure and one is given. */}}
{{- define "nws.certSecret" -}}
{{- if .Values.metrics.secure }}{{ .Values.metrics.certSecret }}{{ end }}
{{- end }}

{{/* The container's own arguments (extraArgs are appended). */}}
{{- define "nws.args" -}}
- --port=8080
- --probe-port=8081
{{- with .Values.logFormat }}
- --log-format={{ . }}
{{- end }}
{{- if .Values.metrics.secure }}
- --metrics-secure
{{- end }}
{{- if include "nws.certSecret" . }}
- --metrics-cert-file=/etc/node-workload-summary/tls/tls.crt
- --metrics-key-file=/etc/node-workload-summary/tls/tls.key
{{- end }}
{{- if .Values.quota.actuation }}
- --quota-actuation=on
{{- end }}
{{- if .Values.fleet.hub }}
- --fleet
- --fleet-namespace={{ .Values.fleet.namespace }}
- --member-grace={{ .Values.fleet.memberGrace }}
{{- end }}
{{- end }}
