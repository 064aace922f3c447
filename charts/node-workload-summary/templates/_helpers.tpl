{{/* Fixed names: one instance per cluster (cluster-wide CRDs, ClusterRole and summaries; one Lease). */}}
{{- define "nws.name" -}}node-workload-summary{{- end }}

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
{{- if .Values.karpenter.events }}
- --karpenter-events=on
{{- end }}
{{- end }}

{{- /* ---- Labels and names: the standard labels, commonLabels, the ServiceAccount. ---- */}}

{{/* What selects the pods (the Deployment's selector, the Service, the PodDisruptionBudget, the
NetworkPolicy): the name alone, as in deploy/ and every earlier version of the chart, since a
Deployment's selector cannot change. */}}
{{- define "nws.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nws.name" . }}
{{- end }}

{{/* The labels of every object the chart renders, and of its pods: the selector, then what deploy/
carries too (component, part-of, version), then what only a Helm release has (helm.sh/chart,
instance, managed-by) and commonLabels. nws.labels: the service's objects (component
"controller"); others: include "nws.componentLabels" (dict "ctx" $ "component" "dashboards"). */}}
{{- define "nws.labels" -}}
{{ include "nws.componentLabels" (dict "ctx" . "component" "controller") }}
{{- end }}

{{- define "nws.componentLabels" -}}
{{- $standard := dict
  "app.kubernetes.io/name" (include "nws.name" .ctx)
  "app.kubernetes.io/component" .component
  "app.kubernetes.io/part-of" (include "nws.name" .ctx)
  "app.kubernetes.io/version" (.ctx.Chart.AppVersion | replace "+" "_" | trunc 63)
  "helm.sh/chart" (printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63)
  "app.kubernetes.io/instance" .ctx.Release.Name
  "app.kubernetes.io/managed-by" .ctx.Release.Service }}
{{- /* commonLabels add to these and never replace one (the name selects the pods). */}}
{{- toYaml (merge $standard (.ctx.Values.commonLabels | default dict)) }}
{{- end }}

{{/* The ServiceAccount the pods run as (created by the chart unless serviceAccount.create is false). */}}
{{- define "nws.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "nws.name" .) }}
{{- end }}
