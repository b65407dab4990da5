{{/* The release's full name, trimmed to a DNS label. */}}
{{- define "muralist.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "muralist.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "muralist.labels" -}}
{{ include "muralist.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "muralist.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "muralist.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "muralist.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "muralist.peeringName" -}}
{{- default (include "muralist.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "muralist.progressService" -}}
{{- printf "%s-progress" (include "muralist.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "muralist.progressTlsSecret" -}}
{{- default (printf "%s-progress-tls" (include "muralist.fullname" .)) .Values.progress.tls.secretName -}}
{{- end -}}

{{/* The base URL the pods post to: the progress Service, by its cluster DNS name. */}}
{{- define "muralist.progressUrl" -}}
{{- printf "https://%s.%s.svc:%v" (include "muralist.progressService" .) .Release.Namespace .Values.progress.service.port -}}
{{- end -}}

{{- define "muralist.selfManagedTls" -}}
{{- if and .Values.progress.enabled (not .Values.progress.certManager.enabled) }}true{{ end -}}
{{- end -}}

{{- define "muralist.peered" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end -}}
{{- end -}}

{{/*
What the operator does in a watched namespace (operator/muralist_operator/kube.py and the
kopf handlers in handlers.py), and nothing more.
*/}}
{{- define "muralist.namespacedRules" -}}
# The DiffusionJobs: kopf lists and watches them; the operator reads one fresh per reconcile
# and deletes it when ttlSecondsAfterFinished has passed.
- apiGroups: ["muralist.dev"]
  resources: ["diffusionjobs"]
  verbs: ["get", "list", "watch", "delete"]
# One status write per reconcile.
- apiGroups: ["muralist.dev"]
  resources: ["diffusionjobs/status"]
  verbs: ["patch"]
# Children carry an owner reference with blockOwnerDeletion, which (with the
# OwnerReferencesPermissionEnforcement admission plugin) needs update on the owner's finalizers.
- apiGroups: ["muralist.dev"]
  resources: ["diffusionjobs/finalizers"]
  verbs: ["update"]
# The Indexed Job: watched (kopf index), created, read when its name is taken (whose is it?),
# patched to (un)suspend, deleted when a job fails in a way its own rules cannot see or passes
# its deadline.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Pods: watched (failures per index, who may post progress); a stalled pod is annotated with
# the reason and deleted (the Job retries it).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch", "delete"]
# The headless Service and the spec ConfigMap of each job: watched (only those labelled as a
# job's, but RBAC cannot say so), so that one deleted is created again; read when its name is
# taken (whose is it?).
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create"]
# Each job's NetworkPolicy (only its own pods reach its pods), unless switched off; the same.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create"]
# One Event per transition of a DiffusionJob; the Warning events about a pod that does not
# start (FailedMount) or its Job (FailedCreate), which say what their status cannot.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end -}}

{{/* Cluster-scoped reads: kopf's (new CRDs, and in namespaced mode namespaces coming and going), and the
nodes' GPU labels strategy Auto plans from. */}}
{{- define "muralist.discoveryRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}

{{/* kopf keeps one status entry per instance in the peering object (list, watch, patch); the
operator reads it (get) to know whether kopf has paused it. */}}
{{- define "muralist.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["{{ if .Values.watchNamespaces }}kopfpeerings{{ else }}clusterkopfpeerings{{ end }}"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}

{{- define "muralist.subjects" -}}
- kind: ServiceAccount
  name: {{ include "muralist.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}
