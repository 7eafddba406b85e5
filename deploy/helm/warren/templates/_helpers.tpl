{{- define "warren.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "warren.nodesService" -}}
{{- printf "%s-nodes" (include "warren.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warren.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "warren.labels" -}}
{{ include "warren.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "warren.userSecret" -}}
{{- .Values.defaultUser.existingSecret | default (printf "%s-default-user" (include "warren.fullname" .)) -}}
{{- end -}}

{{- define "warren.clusterTlsSecret" -}}
{{- .Values.clusterTls.existingSecret | default (printf "%s-cluster-tls" (include "warren.fullname" .)) -}}
{{- end -}}

{{/* The founding members by their pods' stable DNS names: every pod of the StatefulSet. */}}
{{- define "warren.seeds" -}}
{{- $fullname := include "warren.fullname" . -}}
{{- $nodes := include "warren.nodesService" . -}}
{{- $seeds := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $seeds = append $seeds (printf "%s-%d.%s.$(POD_NAMESPACE).svc:25672" $fullname $i $nodes) -}}
{{- end -}}
{{- join "," $seeds -}}
{{- end -}}

{{/* A Kubernetes quantity (2Gi, 512Mi, 2G, 2147483648) in bytes. */}}
{{- define "warren.bytes" -}}
{{- $v := toString . -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $bytes := "" -}}
{{- range $suffix, $scale := $units -}}
{{- if and (not $bytes) (hasSuffix $suffix $v) (regexMatch "^[0-9]+$" (trimSuffix $suffix $v)) -}}
{{- $bytes = mul (trimSuffix $suffix $v | int64) $scale | toString -}}
{{- end -}}
{{- end -}}
{{- if and (not $bytes) (regexMatch "^[0-9]+$" $v) -}}{{- $bytes = $v -}}{{- end -}}
{{- required (printf "resources.limits.memory %q is not a quantity this chart reads (e.g. 2Gi)" $v) $bytes -}}
{{- end -}}
