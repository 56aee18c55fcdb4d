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

{{- define "understudy.operatorJob" -}}
{{- default (printf "%s-metrics" (include "understudy.operatorName" .)) .Values.monitoring.prometheusRule.operatorJob -}}
{{- end -}}

{{/* RBAC rules for what a BrokerGroup owns, in one namespace or all of them. */}}
{{- define "understudy.namespacedRules" -}}
# The custom resources: watch, patch status, manage the finalizer.
- apiGroups: ["understudy.io"]
  resources: ["brokergroups", "brokertopics"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["understudy.io"]
  resources: ["brokergroups/status", "brokertopics/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["understudy.io"]
  resources: ["brokergroups/finalizers", "brokertopics/finalizers"]
  verbs: ["update"]
# Children of a BrokerGroup.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Pods are the controller's liveness source; deleting one is the rollout (updateStrategy OnDelete).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# retentionOnDelete: Delete when the StatefulSet PVC retention policy cannot apply.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "delete"]
# An Event on every mode change.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
