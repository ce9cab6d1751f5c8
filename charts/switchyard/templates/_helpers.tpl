{{/* Names. Kubernetes names are at most 63 characters; suffixes are added after truncation. */}}

{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name alone when it already says "switchyard", so a release named
     switchyard gives the names the plain manifests in webhooks/ use. */}}
{{- define "switchyard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "switchyard.labels" -}}
{{ include "switchyard.commonLabels" . }}
{{ include "switchyard.selectorLabels" . }}
{{- end -}}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.role }}
{{- end -}}

{{- define "switchyard.schedulerLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "switchyard.serviceName" -}}
{{ include "switchyard.fullname" . }}-webhook
{{- end -}}

{{- define "switchyard.serviceAccountName" -}}
{{ default (include "switchyard.fullname" .) .Values.serviceAccount.name }}
{{- end -}}

{{- define "switchyard.dispatcherServiceAccountName" -}}
{{ default (printf "%s-dispatcher" (include "switchyard.fullname" .)) .Values.workerAccess.serviceAccountName }}
{{- end -}}

{{- define "switchyard.schedulerLeaseName" -}}
{{ default (printf "%s-scheduler" (include "switchyard.fullname" .)) .Values.scheduler.leaderElection.leaseName }}
{{- end -}}

{{/* The serving Certificate cert-manager issues and cainjector reads. */}}
{{- define "switchyard.servingCertificateName" -}}
{{ include "switchyard.fullname" . }}-serving
{{- end -}}

{{- define "switchyard.tlsSecretName" -}}
{{- if .Values.certManager.enabled -}}
{{ include "switchyard.fullname" . }}-tls
{{- else -}}
{{ .Values.tls.secretName }}
{{- end -}}
{{- end -}}

{{- define "switchyard.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* kube-scheduler's tag: the API server's vMAJOR.MINOR.PATCH, without a provider suffix
     such as -eks-... or +k3s1, which registry.k8s.io does not publish. */}}
{{- define "switchyard.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v[0-9]+[.][0-9]+[.][0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{ .Values.scheduler.image.repository }}:{{ $tag }}
{{- end -}}

{{/* The webhooks' namespaceSelector: never the release namespace (a Job there would need the
     webhook to start the webhook) nor kube-system, plus what the user adds. */}}
{{- define "switchyard.namespaceSelector" -}}
{{- $selector := .Values.webhooks.namespaceSelector -}}
{{- if $selector.matchLabels }}
matchLabels:
  {{- toYaml $selector.matchLabels | nindent 2 }}
{{- end }}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [{{ .Release.Namespace | quote }}, "kube-system"]
{{- with $selector.matchExpressions }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* How the webhooks trust the serving certificate. */}}
{{- define "switchyard.webhookAnnotations" -}}
{{- if .Values.certManager.enabled }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "switchyard.servingCertificateName" .) }}
{{- end }}
{{- end -}}

{{- define "switchyard.clientConfig" -}}
service:
  namespace: {{ .root.Release.Namespace }}
  name: {{ include "switchyard.serviceName" .root }}
  path: {{ .path }}
  port: {{ .root.Values.service.port }}
{{- if not .root.Values.certManager.enabled }}
caBundle: {{ .root.Values.tls.caBundle }}
{{- end }}
{{- end -}}

{{/* The KubeSchedulerConfiguration of the optional second scheduler. */}}
{{- define "switchyard.schedulerConfig" -}}
{{- $s := .Values.scheduler -}}
{{- $lease := include "switchyard.schedulerLeaseName" . -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ $s.leaderElection.enabled }}
  resourceLock: leases
  resourceName: {{ $lease }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ $s.schedulerName }}
extenders:
  - urlPrefix: https://{{ include "switchyard.serviceName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.service.port }}/scheduler
    filterVerb: filter
    prioritizeVerb: prioritize
    {{- if $s.extender.bind }}
    bindVerb: bind
    {{- end }}
    weight: {{ $s.extender.weight }}
    enableHTTPS: true
    tlsConfig:
      # The CA that signed the serving certificate (the same one the webhooks trust).
      caFile: /etc/switchyard/ca/ca.crt
    # Only node names go back and forth: far less to encode for large clusters.
    nodeCacheCapable: true
    httpTimeout: {{ $s.extender.httpTimeout }}
    ignorable: {{ $s.extender.ignorable }}
    # No managedResources: CPU-only Guaranteed pods need NUMA alignment too.
{{- end -}}

{{/* "true" when the chart grants and hooks JobSets, else empty: jobset.enabled true or
     false, or auto: when this cluster serves jobset.x-k8s.io/v1alpha2 (Helm asks the API
     server at install and upgrade; `helm template` needs --api-versions for it). */}}
{{- define "switchyard.jobsetEnabled" -}}
{{- $on := .Values.jobset.enabled -}}
{{- if eq (toString $on) "auto" -}}
{{- $on = or (.Capabilities.APIVersions.Has "jobset.x-k8s.io/v1alpha2") (.Capabilities.APIVersions.Has "jobset.x-k8s.io/v1alpha2/JobSet") -}}
{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}
