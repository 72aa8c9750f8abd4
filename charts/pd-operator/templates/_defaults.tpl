{{- /*
Generated from operator/tools/pd_operator_tools/generate/chart.py by `pdctl chart`; do not edit.
The chart's default values (values.yaml), for keys missing from .Values: helm upgrade
--reuse-values renders with the previous release's values only (helm pkg/action/upgrade.go
reuseValues), so a key added to the chart since is absent. Every template starts with
`include "pd-operator.fillDefaults" .`, which adds each missing key (recursively) and
changes nothing that is set: unlike sprig's merge, a false, 0 or empty value stays. */ -}}
{{- define "pd-operator.defaults" -}}
{"affinity":{},"autoscaling":{"freeGPUCap":true,"prometheusTokenURLs":[]},"dashboard":{"enabled":false,"labels":{"grafana_dashboard":"1"},"namespace":""},"global":{},"image":{"pullPolicy":"IfNotPresent","repository":"ghcr.io/pd-operator/pd-operator","tag":""},"imagePullSecrets":[],"kubeStateMetrics":{"enabled":false},"leaderElection":{"enabled":true,"leaseDurationSeconds":15,"leaseName":"pd-operator-leader","renewSeconds":5},"livenessPort":8080,"metrics":{"port":9090,"service":true,"serviceMonitor":{"enabled":false,"interval":"30s","labels":{}}},"nodeSelector":{},"podAnnotations":{},"podDisruptionBudget":{"enabled":true},"podLabels":{},"priorityClassName":"","prometheusRule":{"enabled":false,"for":"10m","itlTargetSeconds":0.05,"labels":{},"roleLabel":"pdserving_io_role","serviceLabel":"pdserving_io_service","ttftTargetSeconds":1.0,"window":"5m"},"rbac":{"create":true,"scope":"cluster","secretReads":false},"replicas":2,"resources":{"limits":{"memory":"512Mi"},"requests":{"cpu":"100m","memory":"256Mi"}},"resyncSeconds":600,"serviceAccount":{"annotations":{},"create":true,"name":""},"tolerations":[],"verbose":false,"watchNamespaces":[],"webhook":{"certManager":{"enabled":false,"issuerRef":{"group":"cert-manager.io","kind":"Issuer","name":""}},"certificate":{"renewDaysBefore":90,"validityDays":3650},"enabled":true,"port":9443,"timeoutSeconds":5}}
{{- end -}}

{{- define "pd-operator.fillDefaults" -}}
{{- include "pd-operator.fillMissing" (list .Values (include "pd-operator.defaults" . | fromJson)) -}}
{{- end -}}

{{- define "pd-operator.fillMissing" -}}
{{- $dst := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- if not (hasKey $dst $key) -}}
{{- $_ := set $dst $key $value -}}
{{- else if and (kindIs "map" $value) (kindIs "map" (index $dst $key)) -}}
{{- include "pd-operator.fillMissing" (list (index $dst $key) $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
