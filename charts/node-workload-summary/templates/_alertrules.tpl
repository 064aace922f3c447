{{/*
The PrometheusRule's spec: the rules of alerts/rules.py as deploy/render.py writes them to
files/alert-rules.yaml, read as data and never as a template (the rules' own templates reach
Prometheus untouched). Each ${Alert.setting} in it is filled in from prometheusRule.overrides, else
from the file's defaults, and ${runbookBaseUrl} from prometheusRule.runbookBaseUrl (empty: no
runbook_url, each rule's runbook annotation names its section of docs/runbooks.md); the alerts named
in prometheusRule.disabled are left out, and prometheusRule.additionalRuleLabels go on every rule.
A name that matches no alert or setting fails the render instead of being ignored.
*/}}
{{- define "nws.alertRules" -}}
{{- $v := .Values.prometheusRule -}}
{{- $text := .Files.Get "files/alert-rules.yaml" -}}
{{- $defaults := (fromYaml $text).defaults -}}
{{- $overrides := $v.overrides | default dict -}}
{{- $disabled := $v.disabled | default dict -}}
{{- $extra := $v.additionalRuleLabels | default dict -}}
{{- $alerts := keys $defaults | sortAlpha | join ", " -}}
{{- range $name, $_ := $disabled }}
  {{- if not (hasKey $defaults $name) }}
    {{- fail (printf "prometheusRule.disabled.%s: no such alert (%s)" $name $alerts) }}
  {{- end }}
{{- end }}
{{- range $name, $settings := $overrides }}
  {{- if not (hasKey $defaults $name) }}
    {{- fail (printf "prometheusRule.overrides.%s: no such alert (%s)" $name $alerts) }}
  {{- end }}
  {{- $known := get $defaults $name }}
  {{- range $key, $_ := $settings }}
    {{- if not (hasKey $known $key) }}
      {{- fail (printf "prometheusRule.overrides.%s.%s: no such setting (%s)" $name $key (keys $known | sortAlpha | join ", ")) }}
    {{- end }}
  {{- end }}
{{- end }}
{{- if $v.runbookBaseUrl }}
{{- $text = replace "${runbookBaseUrl}" $v.runbookBaseUrl $text }}
{{- else }}
{{- /* No address where docs/runbooks.md is served: no link, each rule's runbook annotation names it. */}}
{{- $text = regexReplaceAll "(?m)^ *runbook_url: [$][{]runbookBaseUrl[}]#.*\n" $text "" }}
{{- end }}
{{- range $name, $known := $defaults }}
  {{- $settings := get $overrides $name | default dict }}
  {{- range $key, $default := $known }}
    {{- $value := ternary (get $settings $key) $default (hasKey $settings $key) }}
    {{- $text = replace (printf "${%s.%s}" $name $key) (toString $value) $text }}
    {{- $text = replace (printf "${%s.%s|percent}" $name $key) (printf "%.0f%%" (mulf $value 100)) $text }}
  {{- end }}
{{- end }}
{{- $filled := fromYaml $text }}
{{- if hasKey $filled "Error" }}
  {{- fail (printf "prometheusRule: the rules do not parse with these values: %s" $filled.Error) }}
{{- end }}
{{- $groups := list }}
{{- range $filled.spec.groups }}
  {{- $rules := list }}
  {{- range .rules }}
    {{- $rule := . }}
    {{- if not (get $disabled $rule.alert) }}
      {{- $labels := deepCopy $rule.labels }}
      {{- range $key, $value := $extra }}
        {{- if hasKey $rule.labels $key }}
          {{- fail (printf "prometheusRule.additionalRuleLabels.%s: %s sets its own" $key $rule.alert) }}
        {{- end }}
        {{- $_ := set $labels $key (toString $value) }}
      {{- end }}
      {{- $_ := set $rule "labels" $labels }}
      {{- $rules = append $rules $rule }}
    {{- end }}
  {{- end }}
  {{- $groups = append $groups (dict "name" .name "rules" $rules) }}
{{- end }}
{{- toYaml (dict "groups" $groups) }}
{{- end }}
