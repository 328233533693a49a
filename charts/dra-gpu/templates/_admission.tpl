{{/*
Names of the admission webhook's objects, one define each: the Service, the Secret, the
ValidatingWebhookConfiguration and the cert-manager objects are named here and nowhere else, so
the controller's environment (DRA_GPU_WEBHOOK_*), its RBAC resourceNames and the objects agree.
*/}}

{{/* The webhook runs at all: a controller, with admission on. */}}
{{- define "dra-gpu.webhook.enabled" -}}
{{- if and .Values.controller.enabled .Values.controller.admission.enabled -}}true{{- end -}}
{{- end -}}

{{/* The controller issues the certificate itself (cert-manager off): it then writes the Secret
and the webhook configuration's caBundle. */}}
{{- define "dra-gpu.webhook.selfIssued" -}}
{{- if and (include "dra-gpu.webhook.enabled" .) (not .Values.controller.admission.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{- define "dra-gpu.webhook.service" -}}
{{- printf "%s-webhook" (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The serving certificate (and, self-issued, its CA): written by the controller or by
cert-manager, never rendered by the chart. */}}
{{- define "dra-gpu.webhook.secret" -}}
{{- printf "%s-webhook-tls" (include "dra-gpu.fullname" .) -}}
{{- end -}}

{{/* Cluster-scoped, so it carries the namespace (dra-gpu.clusterName). */}}
{{- define "dra-gpu.webhook.configuration" -}}
{{- include "dra-gpu.clusterName" . -}}
{{- end -}}

{{- define "dra-gpu.webhook.certificate" -}}
{{- printf "%s-webhook" (include "dra-gpu.fullname" .) -}}
{{- end -}}

{{- define "dra-gpu.webhook.issuer" -}}
{{- printf "%s-webhook-selfsigned" (include "dra-gpu.fullname" .) -}}
{{- end -}}

{{/* A webhook's name must be a domain of at least three labels: <resource>.<driverName>, with
"admission." between them when the driver name is a single label. Include with
(dict "root" $ "resource" "resourceclaims"). */}}
{{- define "dra-gpu.webhook.name" -}}
{{- $driver := .root.Values.driverName -}}
{{- if contains "." $driver -}}
{{- printf "%s.%s" .resource $driver -}}
{{- else -}}
{{- printf "%s.admission.%s" .resource $driver -}}
{{- end -}}
{{- end -}}

{{/* Where the controller reads a cert-manager certificate (the Secret, mounted). */}}
{{- define "dra-gpu.webhook.certDir" -}}
/var/run/dra-gpu/webhook
{{- end -}}
