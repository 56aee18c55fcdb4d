{{/* Names, labels and the ZooKeeper connect string shared by the templates. */}}

{{- define "understudy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "understudy.operatorName" -}}
{{- printf "%s-operator" (include "understudy.fullname" .) -}}
{{- end -}}

{{- define "understudy.zookeeperName" -}}
{{- printf "%s-zookeeper" (include "understudy.fullname" .) -}}
{{- end -}}

{{- define "understudy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "understudy.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "understudy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: understudy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "understudy.operatorSelector" -}}
app.kubernetes.io/name: understudy-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "understudy.zookeeperSelector" -}}
app.kubernetes.io/name: understudy-zookeeper
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* host:port list of the ZooKeeper ensemble, without chroot. */}}
{{- define "understudy.zkConnect" -}}
{{- if .Values.zookeeper.enabled -}}
{{- $name := include "understudy.zookeeperName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.zookeeper.replicas) -}}
{{- $hosts = append $hosts (printf "%s-%d.%s-headless.%s.svc:2181" $name $i $name $ns) -}}
{{- end -}}
{{- join "," $hosts -}}
{{- else -}}
{{- required "zookeeper.externalConnect is required when zookeeper.enabled is false" .Values.zookeeper.externalConnect -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the ZooKeeper digest (key "digest") and super password. */}}
{{- define "understudy.zkAuthSecret" -}}
{{- default (printf "%s-zookeeper-auth" (include "understudy.fullname" .)) .Values.zookeeper.auth.existingSecret -}}
{{- end -}}

{{/* The operator's CA Secret (in the release namespace). */}}
{{- define "understudy.caSecret" -}}
{{- default (printf "%s-ca" (include "understudy.fullname" .)) .Values.operator.ca.secretName -}}
{{- end -}}

{{/* Namespaces whose broker pods may reach ZooKeeper: the watched ones, or all. */}}
{{- define "understudy.brokerNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- toYaml .Values.operator.watchNamespaces | nindent 8 }}
{{- else }}
namespaceSelector: {}
{{- end }}
{{- end -}}

{{- define "understudy.operatorJob" -}}
{{- default (printf "%s-metrics" (include "understudy.operatorName" .)) .Values.monitoring.prometheusRule.operatorJob -}}
{{- end -}}

{{/*
RBAC rules for what the operator manages, in one namespace or all of them: exactly the verbs
it uses. tests/test_operator_security.py derives them from k8s/kube.py's calls in the
operator's handlers plus kopf's documented needs, and fails on any verb nobody uses.
*/}}
{{- define "understudy.namespacedRules" -}}
# The custom resources. kopf: list + watch (its watch streams), patch (finalizers, its
# progress annotations and status.kopf); the handlers: get (a fresh body for the status).
- apiGroups: ["understudy.io"]
  resources: ["brokergroups"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["understudy.io"]
  resources: ["brokertopics", "brokerusers"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["understudy.io"]
  resources: ["brokergroups/status", "brokertopics/status", "brokerusers/status"]
  verbs: ["patch"]
# kopf.adopt sets blockOwnerDeletion on the children's owner references: with the
# OwnerReferencesPermissionEnforcement admission plugin that needs update on the owner's
# finalizers subresource.
- apiGroups: ["understudy.io"]
  resources: ["brokergroups/finalizers", "brokerusers/finalizers"]
  verbs: ["update"]
# Children of a BrokerGroup: applied with GET then POST or merge-PATCH, never PUT.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "create", "patch", "delete"]
# Certificates, group secrets, the brokers' ZooKeeper digest, tls users' certificates (and the
# CA when it lives in the resources' namespace); BrokerUser password Secrets are only read.
# No list or watch: the operator reads Secrets by name.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch", "delete"]
# Pods are the controller's liveness source (kopf watches them); deleting one is the rollout
# (updateStrategy OnDelete).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# retentionOnDelete: Delete when the StatefulSet PVC retention policy cannot apply.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "delete"]
# Events: the operator's (mode changes, rollouts, refusals) and kopf's (handler errors).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
