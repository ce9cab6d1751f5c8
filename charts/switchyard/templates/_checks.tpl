{{/* Checks values.schema.json cannot express; each failure says what to change. */}}
{{- define "switchyard.checks" -}}
{{- if and (eq .Values.role "manager") (semverCompare "<1.32.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "role manager needs Kubernetes 1.32 or newer (this cluster is %s): the manager's Jobs rely on spec.managedBy to keep its own Job controller from running them" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and .Values.scheduler.enabled (not .Values.scheduler.image.tag) (not (regexMatch "^v[0-9]+[.][0-9]+[.][0-9]+" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "scheduler.image.tag: cannot derive a kube-scheduler tag from the cluster version %q; set it, e.g. v1.33.1" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and (eq .Values.role "manager") .Values.webhooks.mutating.objectSelector .Values.config.defaultQueue -}}
{{- if hasKey .Values.webhooks.mutating.objectSelector "matchExpressions" -}}
{{- range .Values.webhooks.mutating.objectSelector.matchExpressions -}}
{{- if and (eq .key "switchyard.dev/queue-name") (eq .operator "Exists") -}}
{{- fail "webhooks.mutating.objectSelector only lets labelled Jobs through, so config.defaultQueue could never label one: remove the selector (null lets the chart choose)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
