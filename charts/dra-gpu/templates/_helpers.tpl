{{/*
Names and labels shared by every template. The driver name is one value, .Values.driverName,
used for the agent's plugin name, the DeviceClass selectors and both components' environment.
*/}}

{{- define "dra-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-gpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects (ClusterRoles, the policy) carry the namespace too: two releases
of the same name in different namespaces must not overwrite each other's. */}}
{{- define "dra-gpu.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-gpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-gpu.labels" -}}
helm.sh/chart: {{ include "dra-gpu.chart" . }}
app.kubernetes.io/name: {{ include "dra-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "root" $ "component" "agent"). */}}
{{- define "dra-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-gpu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dra-gpu.componentLabels" -}}
{{ include "dra-gpu.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dra-gpu.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (printf "%s-controller" (include "dra-gpu.fullname" .)) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (printf "%s-agent" (include "dra-gpu.fullname" .)) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The hardened container securityContext both components share; the agent adds runAsUser 0. */}}
{{- define "dra-gpu.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The simulated backend's profile as YAML: agent.profile when given (whole, never merged with the
tutorial's), else profiles/tutorial.yaml.
*/}}
{{- define "dra-gpu.profile" -}}
{{- if .Values.agent.profile -}}
{{- toYaml .Values.agent.profile -}}
{{- else -}}
{{- .Files.Get "profiles/tutorial.yaml" | trim -}}
{{- end -}}
{{- end -}}
