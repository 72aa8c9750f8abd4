{{/* Chart name. */}}
{{- define "pd-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name when it already holds the chart name. */}}
{{- define "pd-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pd-operator.labels" -}}
{{ include "pd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "pd-operator.serviceAccountName" -}}
{{- default (include "pd-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The namespaces the operator serves, one per line; empty: all. */}}
{{- define "pd-operator.watchNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- join "\n" (uniq .Values.watchNamespaces) -}}
{{- else if eq .Values.rbac.scope "namespace" -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The operator's namespaced permissions (ClusterRole or Role rules). */}}
{{- define "pd-operator.rules" -}}
# Its own resource: read, watch, and patch (kopf keeps its annotations there).
- apiGroups: [pdserving.io]
  resources: [pdinferenceservices]
  verbs: [get, list, watch, patch]
# Status (conditions, pools, endpoint) through the status subresource.
- apiGroups: [pdserving.io]
  resources: [pdinferenceservices/status]
  verbs: [get, patch]
# Owner references with blockOwnerDeletion (render: every child's): the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift enables it)
# refuses them unless the writer may update the owner's finalizers.
- apiGroups: [pdserving.io]
  resources: [pdinferenceservices/finalizers]
  verbs: [update]
# Events on the services (Created, InvalidSpec, ...); list: the StatefulSet
# controller reports a pod create the API server refused (Pod Security, quota)
# only as a FailedCreate event, which status repeats with the fix.
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
# Pods: status and Pending reasons. Also granted onward to each router (RBAC
# lets the operator create that Role only because it holds these verbs).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# The children it server-side applies (create + patch), watches and prunes.
- apiGroups: [""]
  resources: [services, serviceaccounts, configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, delete]
# Pools whose replicas span nodes run as LeaderWorkerSets (LWS must be installed).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
{{- if .Values.rbac.secretReads }}
# rbac.secretReads: get (never list or watch) a referenced API-key Secret.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end -}}

{{/* Refuse to roll this operator onto a CustomResourceDefinition other than its own.
     Helm installs crds/ only when the release is first installed (and skips a CRD that
     already exists) and never upgrades it: with an older CRD in the cluster the API
     server prunes every field it does not know from specs and from the operator's
     status writes. Argument: (list . installedCRD); an empty installedCRD (helm
     template, lint, client dry-runs: lookup finds nothing) checks nothing. */}}
{{- define "pd-operator.crdCheck" -}}
{{- $root := index . 0 -}}
{{- $installed := index . 1 -}}
{{- if $installed -}}
{{- $key := "pdserving.io/schema-hash" -}}
{{- $want := dig "metadata" "annotations" $key "" ($root.Files.Get "crds/pdinferenceservices.yaml" | fromYaml) -}}
{{- $got := dig "metadata" "annotations" $key "" $installed -}}
{{- if ne $got $want -}}
{{- fail (printf "the CustomResourceDefinition pdinferenceservices.pdserving.io in the cluster is not this chart's (%s %q, the chart's %q), and Helm never upgrades crds/: apply the chart's first, e.g. `helm show crds CHART | kubectl apply --server-side --force-conflicts -f -` or `kubectl apply --server-side --force-conflicts -f charts/pd-operator/crds/pdinferenceservices.yaml`, then upgrade again" $key $got $want) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Refuse a Lease another release's operator holds: replicas sharing a Lease have one
     writer among them, so a second release in the namespace would stand by for ever and
     never serve its namespaces. The holder identity is POD_NAME_<suffix>
     (controller/leader.py default_identity). Argument: (list . lease holderPod), what
     lookup found; an empty lease or pod (none yet, a holder gone, helm template) checks
     nothing. */}}
{{- define "pd-operator.leaseCheck" -}}
{{- $root := index . 0 -}}
{{- $holder := dig "spec" "holderIdentity" "" (index . 1) -}}
{{- $pod := index . 2 -}}
{{- if and $holder $pod (ne (dig "metadata" "labels" "app.kubernetes.io/instance" "" $pod) $root.Release.Name) -}}
{{- fail (printf "the Lease %s/%s is held by %q, an operator of another release: replicas sharing a Lease have one writer among them, so this release would never serve its namespaces; set leaderElection.leaseName to a name of its own" $root.Release.Namespace $root.Values.leaderElection.leaseName $holder) -}}
{{- end -}}
{{- end -}}

{{- /* The webhook's serving certificate, key and CA (base64), the caBundle the API server
     is given, the certificate's not-after date, and the CA it replaced with the date until
     which the bundle still holds it, as JSON. Arguments: the root context, the Secret lookup
     found (empty: none yet, or helm template / GitOps, where lookup finds nothing) and the
     certificate's DNS names. The Secret's pair is kept across upgrades while more than
     webhook.certificate.renewDaysBefore days are left (its date is the Secret's annotation,
     valid for the certificate whose SHA-256 the Secret also notes: one made by an older
     chart, or written by cert-manager, as when certManager was turned off while its
     Certificate still issued, is made anew). A new pair gets a new CA, and for an hour the
     caBundle holds the CAs before it too (one renewed within the hour of another keeps
     both), kept in the Secret (ca-previous.crt) so that an upgrade within the hour keeps
     them: the pods serve the old certificate until the kubelet updates the mounted Secret
     and the operator reads it again (every 30 s), and the API server must trust both
     meanwhile. */}}
{{- define "pd-operator.webhookCert" -}}
{{- $ := index . 0 }}{{- $existing := index . 1 | default dict }}{{- $dns := index . 2 }}
{{- $c := $.Values.webhook.certificate }}
{{- $data := get $existing "data" | default dict }}
{{- $annotations := dig "metadata" "annotations" dict $existing }}
{{- $notAfter := get $annotations "pdserving.io/webhook-certificate-not-after" }}
{{- $oldCA := get $data "ca.crt" | default "" }}
{{- $now := now | unixEpoch }}
{{- $keep := and $oldCA (get $data "tls.crt") (get $data "tls.key") $notAfter }}
{{- if and $keep (ne (get $annotations "pdserving.io/webhook-certificate-sha256") (get $data "tls.crt" | sha256sum)) }}
{{- $keep = false }}
{{- end }}
{{- $previous := get $data "ca-previous.crt" | default "" }}
{{- $until := get $annotations "pdserving.io/webhook-previous-ca-until" }}
{{- if or (not $previous) (not $until) (le (sub (toDate "2006-01-02T15:04:05Z07:00" $until | unixEpoch) $now) 0) }}
{{- $previous = "" }}{{- $until = "" }}
{{- end }}
{{- if $keep }}
{{- $left := sub (toDate "2006-01-02T15:04:05Z07:00" $notAfter | unixEpoch) $now }}
{{- if lt $left (mul (int $c.renewDaysBefore) 86400) }}{{- $keep = false }}{{- end }}
{{- end }}
{{- if $keep }}
{{- $bundle := $oldCA }}
{{- if $previous }}{{- $bundle = printf "%s%s" ($oldCA | b64dec) ($previous | b64dec) | b64enc }}{{- end }}
{{- dict "crt" (get $data "tls.crt") "key" (get $data "tls.key") "ca" $oldCA "bundle" $bundle "notAfter" $notAfter "previous" $previous "previousUntil" $until | toJson }}
{{- else }}
{{- $days := int $c.validityDays }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "pd-operator.fullname" $)) $days }}
{{- $cert := genSignedCert (index $dns 2) nil $dns $days $ca }}
{{- $older := printf "%s%s" ($oldCA | b64dec) ($previous | b64dec) }}
{{- $until = "" }}
{{- if $older }}
{{- $until = dateInZone "2006-01-02T15:04:05Z07:00" (now | dateModify "+1h") "UTC" }}
{{- end }}
{{- $after := dateInZone "2006-01-02T15:04:05Z07:00" (now | dateModify (printf "+%dh" (mul $days 24))) "UTC" }}
{{- $olderB64 := "" }}{{- if $older }}{{- $olderB64 = $older | b64enc }}{{- end }}
{{- dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc) "bundle" (printf "%s%s" $ca.Cert $older | b64enc) "notAfter" $after "previous" $olderB64 "previousUntil" $until | toJson }}
{{- end }}
{{- end }}
