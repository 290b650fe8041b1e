{{/*
The chart name, or nameOverride.
*/}}
{{- define "kairon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The base name of every object: fullnameOverride, else the release name,
prefixed with the chart name unless the release name already holds it. Kept
to 50 characters so that "-controller" and friends still fit in 63.
*/}}
{{- define "kairon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kairon.controllerName" -}}
{{ include "kairon.fullname" . }}-controller
{{- end }}

{{- define "kairon.nodeName" -}}
{{ include "kairon.fullname" . }}-node
{{- end }}

{{- define "kairon.uiName" -}}
{{ include "kairon.fullname" . }}-ui
{{- end }}

{{- define "kairon.uiSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kairon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ui
{{- end }}

{{- define "kairon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kairon.labels" -}}
helm.sh/chart: {{ include "kairon.chart" . }}
app.kubernetes.io/name: {{ include "kairon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kairon
{{- end }}

{{- define "kairon.controllerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kairon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "kairon.nodeSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kairon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end }}

{{/*
One of the chart's images, as `make images` names it:
(list . "kairon-controller") -> <image.registry>/kairon-controller:<tag>.
*/}}
{{- define "kairon.image" -}}
{{- $root := index . 0 -}}
{{ $root.Values.image.registry }}/{{ index . 1 }}:{{ $root.Values.image.tag | default $root.Chart.AppVersion }}
{{- end }}

{{/*
kairon.leaderElect is "true" when the controller runs with leader election.
*/}}
{{- define "kairon.leaderElect" -}}
{{- if gt (int .Values.controller.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
kairon.caBundle is webhook.caBundle base64-encoded, whether it was given as
base64 or as PEM text.
*/}}
{{- define "kairon.caBundle" -}}
{{- $ca := .Values.webhook.caBundle | trim }}
{{- if hasPrefix "-----BEGIN" $ca }}
{{- $ca | b64enc }}
{{- else }}
{{- $ca | nospace }}
{{- end }}
{{- end }}

{{/*
kairon.validate fails the render on values that cannot work, with a message
saying what to change. templates/validate.yaml includes it, so it runs on
every install, upgrade and template.
*/}}
{{- define "kairon.validate" -}}
{{- if .Values.image.repository }}
{{- fail (printf "image.repository=%q is no longer used: the chart runs three images, <image.registry>/kairon-controller, /kairon-ui and /kairon-node (make images; make push REGISTRY=...). Set image.registry instead." .Values.image.repository) }}
{{- end }}
{{- if not .Values.image.registry }}
{{- fail "image.registry must name where the images are, such as ghcr.io/zyvor (make push REGISTRY=... pushes them there)." }}
{{- end }}
{{- $ce := .Values.controller.cordonEvacuation }}
{{- $strategy := toString $ce.strategy }}
{{- if eq $strategy "live" }}
{{- fail "controller.cordonEvacuation.strategy=live is not allowed: automatic evacuation of a cordoned node never insists on live migration. Use cold or auto (live where the Machine and both nodes can, cold otherwise), or run `kaironctl evacuate NODE --strategy live` yourself." }}
{{- else if not (has $strategy (list "cold" "auto")) }}
{{- fail (printf "controller.cordonEvacuation.strategy=%q is not valid: use cold or auto." $strategy) }}
{{- end }}
{{- if not $ce.minRetryInterval }}
{{- fail "controller.cordonEvacuation.minRetryInterval must be a Go duration such as 2m." }}
{{- end }}
{{- if not .Values.controller.interval }}
{{- fail "controller.interval must be a Go duration such as 5s." }}
{{- end }}
{{- if lt (int .Values.controller.replicas) 1 }}
{{- fail "controller.replicas must be at least 1." }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- if not .Values.webhook.tlsSecretName }}
{{- fail "webhook.enabled=true needs webhook.tlsSecretName: the name of a kubernetes.io/tls Secret (tls.crt, tls.key) in the release namespace, valid for the controller Service's DNS name. The chart does not create a certificate; see docs/guides/helm.md." }}
{{- end }}
{{- if not .Values.webhook.caBundle }}
{{- fail "webhook.enabled=true needs webhook.caBundle: the CA certificate (PEM, or PEM base64-encoded) that signed the Secret's tls.crt, so the API server can trust the webhook. See docs/guides/helm.md." }}
{{- end }}
{{- if not (has (toString .Values.webhook.failurePolicy) (list "Fail" "Ignore")) }}
{{- fail (printf "webhook.failurePolicy=%q is not valid: use Fail or Ignore." (toString .Values.webhook.failurePolicy)) }}
{{- end }}
{{- end }}
{{- if .Values.ui.enabled }}
{{- $port := int .Values.ui.port }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "ui.port=%v is not a TCP port." .Values.ui.port) }}
{{- end }}
{{- end }}
{{- if .Values.node.enabled }}
{{- if not (has (toString .Values.node.backend) (list "qemu" "sim")) }}
{{- fail (printf "node.backend=%q is not valid: use qemu or sim." (toString .Values.node.backend)) }}
{{- end }}
{{- with .Values.migration.tlsHostPath }}
{{- if not (hasPrefix "/" (toString .)) }}
{{- fail (printf "migration.tlsHostPath=%q must be an absolute path on the hosts (a directory with this node's tls.crt, tls.key and ca.crt)." (toString .)) }}
{{- end }}
{{- end }}
{{- if not (has (toString .Values.node.acceleration) (list "auto" "kvm" "tcg")) }}
{{- fail (printf "node.acceleration=%q is not valid: use auto, kvm or tcg." (toString .Values.node.acceleration)) }}
{{- end }}
{{- if not .Values.node.networkCIDR }}
{{- fail "node.networkCIDR must be an IPv4 range such as 10.88.0.0/24." }}
{{- end }}
{{- if and .Values.node.crossNode.clusterGuestCIDR (not (has (toString .Values.node.crossNode.routing) (list "host" "vxlan"))) }}
{{- fail (printf "node.crossNode.routing=%q is not valid: use host or vxlan." (toString .Values.node.crossNode.routing)) }}
{{- end }}
{{- end }}
{{- end }}
