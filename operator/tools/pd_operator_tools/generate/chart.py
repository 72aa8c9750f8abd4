"""The Helm chart's generated files, from one source (pure; no cluster, no helm).

``Values`` below is the chart's configuration: its field descriptions and
defaults produce ``charts/pd-operator/values.yaml`` (every key commented) and
``values.schema.json`` (Helm checks ``--set`` and ``-f`` against it) and the
configuration table of the chart's README.md. The CRD in
``charts/pd-operator/crds/`` is the one ``pdctl crd`` prints (Helm installs
``crds/`` first and never templates it).

    pdctl chart            write them (and templates/_defaults.tpl) into charts/pd-operator
    pdctl chart --check    exit 1 when any of them is stale
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from pd_operator import __version__
from pd_operator.api.crd import crd_yaml

CHART_REL = Path("charts") / "pd-operator"


def find_chart_dir(start: Path | None = None) -> Path:
    """``charts/pd-operator`` of the checkout that holds ``start`` (default: the
    working directory); the generator writes into a source tree, never into an
    installed package."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / CHART_REL / "Chart.yaml").is_file():
            return d / CHART_REL
    raise FileNotFoundError(f"no {CHART_REL}/Chart.yaml in {here} or above: run from a pd-operator checkout, or pass --dir")
HEADER = "# Generated from operator/tools/pd_operator_tools/generate/chart.py by `pdctl chart`; do not edit.\n"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Image(_M):
    """The operator image (operator/Dockerfile)."""

    repository: str = Field("ghcr.io/pd-operator/pd-operator", description="Image repository.")
    tag: str = Field("", description="Image tag; empty: the chart's appVersion.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", alias="pullPolicy", description="Kubernetes imagePullPolicy.")


class Rbac(_M):
    """What the operator may do (least privilege; see the chart README)."""

    create: bool = Field(True, description="Create the ClusterRole/Role and bindings. false: bring your own.")
    scope: Literal["cluster", "namespace"] = Field(
        "cluster",
        description="cluster: cluster-wide reads of nodes and pods (the autoscaler caps a scale-up at what the "
                    "free GPUs fit); the writes are one ClusterRole when watchNamespaces is empty (every "
                    "namespace served), else a Role in each of watchNamespaces only. namespace: a Role in each "
                    "of watchNamespaces (default: the release namespace); only a read-only ClusterRole for CRD "
                    "and namespace discovery stays cluster-wide, and scale-ups are not capped by free GPUs (the "
                    "Unschedulable guard still holds).")
    secret_reads: bool = Field(
        False, alias="secretReads",
        description="Let the operator get Secrets (never list): to report a missing API-key Secret in status, "
                    "and to read the Prometheus bearer token of spec.autoscaling.prometheus.bearerTokenSecretRef "
                    "(required for that field). Granted in the Role of each served namespace, never "
                    "cluster-wide: needs watchNamespaces or rbac.scope namespace. false: the kubelet reports "
                    "missing Secrets on the pods instead.")


class ServiceAccount(_M):
    """The operator's identity."""

    create: bool = Field(True, description="Create the ServiceAccount.")
    name: str = Field("", description="Its name; empty: the release's full name.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations, e.g. for workload identity.")


# A resource.Quantity as the API server reads it: a string of that form, or a bare
# number (apimachinery pkg/api/resource/quantity.go: splitREString; UnmarshalJSON takes both)
Quantity = Union[Annotated[str, StringConstraints(pattern=r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")],
                 Annotated[float, Field(ge=0)]]


class Resources(_M):
    """Operator container resources."""

    requests: dict[str, Quantity] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"},
                                          description="Requests.")
    limits: dict[str, Quantity] = Field(default_factory=lambda: {"memory": "512Mi"},
                                        description="Limits (no CPU limit: reconcile bursts are short).")


class ServiceMonitor(_M):
    """A prometheus-operator ServiceMonitor for the operator's own metrics."""

    enabled: bool = Field(False, description="Create it (needs the monitoring.coreos.com CRDs).")
    interval: str = Field("30s", description="Scrape interval.")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="Extra labels, e.g. the release label your Prometheus selects.")


class Metrics(_M):
    """The operator's Prometheus endpoint (/metrics)."""

    port: int = Field(9090, ge=1, le=65535, description="Container port of /metrics.")
    service: bool = Field(True, description="Create a ClusterIP Service for the metrics port.")
    service_monitor: ServiceMonitor = Field(default_factory=ServiceMonitor, alias="serviceMonitor",
                                            description="ServiceMonitor settings.")


class PrometheusRule(_M):
    """Alerts (prometheus-operator PrometheusRule). Prometheus cannot read the
    PDInferenceService targets, so the thresholds are chart values; engine
    metrics are matched by the pod labels pdserving_io_service/role that a
    kubernetes_sd pod scrape with labelmap copies from the pods."""

    enabled: bool = Field(False, description="Create it (needs the monitoring.coreos.com CRDs).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels, e.g. the release label your Prometheus selects.")
    ttft_target_seconds: float = Field(1.0, gt=0, alias="ttftTargetSeconds",
                                       description="Alert when a service's p99 time to first token stays above this.")
    itl_target_seconds: float = Field(0.05, gt=0, alias="itlTargetSeconds",
                                      description="Alert when a service's p99 inter-token latency stays above this.")
    for_: str = Field("10m", alias="for", description="How long a condition must hold before it fires.")
    window: str = Field("5m", description="Rate window of the latency quantiles.")
    service_label: str = Field("pdserving_io_service", alias="serviceLabel",
                               description="Prometheus label holding the pod label pdserving.io/service.")
    role_label: str = Field("pdserving_io_role", alias="roleLabel",
                            description="Prometheus label holding the pod label pdserving.io/role (prefill|decode).")


class Dashboard(_M):
    """A Grafana dashboard as a ConfigMap (Grafana's sidecar picks it up by label)."""

    enabled: bool = Field(False, description="Create the ConfigMap.")
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"},
                                   description="Labels the Grafana sidecar selects.")
    namespace: str = Field("", description="Namespace of the ConfigMap; empty: the release namespace.")


class KubeStateMetrics(_M):
    """kube-state-metrics custom-resource-state config exposing PDInferenceService
    replicas, desired and maximum replicas (used by the max-replicas alert and the dashboard)."""

    enabled: bool = Field(False, description="Create a ConfigMap holding the config; pass it to kube-state-metrics "
                                             "with --custom-resource-state-config-file.")


class Autoscaling(_M):
    """What the autoscaler may do on a tenant's behalf."""

    prometheus_token_urls: list[str] = Field(
        default_factory=list, alias="prometheusTokenURLs",
        description="Prometheus endpoints (scheme://host:port[/path]) that may receive the bearer token of a "
                    "service's spec.autoscaling.prometheus.bearerTokenSecretRef; the scheme, host and port must "
                    "match and the path start with the entry's. Empty: no token is ever read or sent, whatever "
                    "rbac.secretReads says (a spec cannot make the operator hand a Secret to a URL of its choosing).")
    free_gpu_cap: bool = Field(
        True, alias="freeGPUCap",
        description="Cap a scale-up at the replicas the GPUs free now fit (needs rbac.scope cluster to read nodes "
                    "and pods). false where a cluster autoscaler or Karpenter adds GPU nodes for Pending pods: the "
                    "cap would keep a pool from ever asking for them (the Unschedulable guard still holds).")


class LeaderElection(_M):
    """Leader election among the operator replicas."""

    enabled: bool = Field(True, description="Hold a Lease to be the one replica that writes. false: only with "
                                            "replicas 0 or 1.")
    lease_name: str = Field(
        "pd-operator-leader", alias="leaseName", max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Name of the Lease in the release namespace. Releases sharing a Lease share one writer: "
                    "give each release installed in the same namespace its own (the chart refuses to install "
                    "a release whose Lease a pod of another release holds).")
    lease_duration_seconds: int = Field(15, ge=5, le=300, alias="leaseDurationSeconds",
                                        description="Seconds without renewal after which a standby takes over "
                                                    "(after a crash; a clean stop releases the Lease at once).")
    renew_seconds: int = Field(5, ge=1, le=100, alias="renewSeconds",
                               description="Seconds between the leader's renewals (and a standby's checks); under "
                                           "half of leaseDurationSeconds (the leader writes only within "
                                           "leaseDurationSeconds - renewSeconds of its last renewal).")


class PodDisruptionBudget(_M):
    """Keeps a voluntary disruption (a node drain) from stopping every replica at once."""

    enabled: bool = Field(True, description="Create it when replicas > 1 (maxUnavailable 1).")


class WebhookCertificate(_M):
    """The certificate Helm makes for the webhook (without certManager): a CA and a serving certificate
    signed by it, kept in a Secret across upgrades."""

    validity_days: int = Field(3650, ge=1, le=36500, alias="validityDays",
                               description="Days the CA and the serving certificate are valid.")
    renew_days_before: int = Field(
        90, ge=0, alias="renewDaysBefore",
        description="helm upgrade makes a new CA and certificate when fewer days than this are left (at or "
                    "above validityDays: at every upgrade). During the change the API server trusts the old CA "
                    "as well, so admission checks on while the pods move to the new certificate. Rotate at "
                    "once: helm upgrade --reuse-values --set webhook.certificate.renewDaysBefore=36500, then "
                    "set it back. Without an upgrade nothing renews it: keep validityDays long, or use "
                    "certManager.")


class IssuerRef(_M):
    """A cert-manager issuer."""

    name: str = Field("", max_length=253, description="Its name. Empty: the chart makes a self-signed CA "
                                                      "(an Issuer and a CA Certificate in the release namespace). "
                                                      "It must give the CA in the Secret's ca.crt (a CA or Vault "
                                                      "issuer does; ACME does not), which the CA injector copies "
                                                      "into the caBundle.")
    kind: Literal["Issuer", "ClusterIssuer"] = Field("Issuer", description="Issuer (in the release namespace) "
                                                                           "or ClusterIssuer.")
    group: str = Field("cert-manager.io", description="Its API group.")


class CertManager(_M):
    """cert-manager issues and renews the webhook's certificate (its CRDs and controller must be installed)."""

    enabled: bool = Field(False, description="A cert-manager Certificate makes the webhook's Secret and renews "
                                             "it; cert-manager's CA injector writes the webhook configuration's "
                                             "caBundle; the operator serves a renewed certificate within 30 s of "
                                             "the kubelet updating the mounted Secret. Turning it on over a "
                                             "release with Helm's certificate leaves admission unchecked (failure "
                                             "policy Ignore) until cert-manager has issued and the pods read it.")
    issuer_ref: IssuerRef = Field(default_factory=IssuerRef, alias="issuerRef",
                                  description="Issuer of the serving certificate.")


class Webhook(_M):
    """The validating admission webhook: `kubectl apply` of a spec the operator would refuse (an extraArgs flag
    the pinned engine or router does not have, a managed flag, ...) fails at once with the field path."""

    enabled: bool = Field(True, description="Serve it and register it (failurePolicy Ignore: an operator that "
                                            "is down never blocks the cluster; status still reports the problem). "
                                            "Its certificate is made by Helm (webhook.certificate) or by "
                                            "cert-manager (webhook.certManager).")
    certificate: WebhookCertificate = Field(default_factory=WebhookCertificate,
                                            description="The certificate Helm makes (without certManager).")
    cert_manager: CertManager = Field(default_factory=CertManager, alias="certManager",
                                      description="Have cert-manager issue and renew the certificate instead.")
    port: int = Field(9443, ge=1024, le=65535, description="Container port of the webhook (HTTPS).")
    timeout_seconds: int = Field(5, ge=1, le=30, alias="timeoutSeconds",
                                 description="How long the API server waits for an answer before ignoring it.")


# A namespace's name (apimachinery pkg/api/validation/generic.go: ValidateNamespaceName is
# a DNS-1123 label): each entry becomes a Role's namespace and a --namespace flag, so no
# globs (kopf would take them; RBAC cannot) and no empty entry.
NamespaceName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]


class Values(_M):
    """pd-operator chart values."""

    image: Image = Field(default_factory=Image, description="Operator image.")
    image_pull_secrets: list[dict[str, str]] = Field(default_factory=list, alias="imagePullSecrets",
                                                     description="Pull secrets, e.g. [{name: regcred}].")
    replicas: int = Field(2, ge=0, le=5, description="Operator replicas. One holds the leader Lease and writes; "
                                                     "the others watch (warm caches) and take over within "
                                                     "leaderElection.leaseDurationSeconds. More than 1 needs "
                                                     "leaderElection.enabled.")
    leader_election: LeaderElection = Field(default_factory=LeaderElection, alias="leaderElection",
                                            description="Leader election (a coordination.k8s.io Lease in the "
                                                        "release namespace).")
    webhook: Webhook = Field(default_factory=Webhook, description="Validating admission webhook.")
    pod_disruption_budget: PodDisruptionBudget = Field(default_factory=PodDisruptionBudget,
                                                       alias="podDisruptionBudget",
                                                       description="PodDisruptionBudget of the operator pods "
                                                                   "(with replicas > 1).")
    watch_namespaces: list[NamespaceName] = Field(
        default_factory=list, alias="watchNamespaces",
        description="Namespaces to serve, e.g. [team-a, team-b]: the operator writes only there (a Role in "
                    "each). Empty: all (rbac.scope cluster, with cluster-wide writes) or the release namespace "
                    "(rbac.scope namespace).")
    resync_seconds: int = Field(600, ge=5, alias="resyncSeconds",
                                description="Drift and status backstop period (child events act within seconds; "
                                            "a service missing a Secret is looked at every 10 s).")
    verbose: bool = Field(False, description="Debug logging.")
    rbac: Rbac = Field(default_factory=Rbac, description="RBAC settings.")
    autoscaling: Autoscaling = Field(default_factory=Autoscaling, description="Autoscaler settings.")
    service_account: ServiceAccount = Field(default_factory=ServiceAccount, alias="serviceAccount",
                                            description="ServiceAccount settings.")
    resources: Resources = Field(default_factory=Resources, description="Operator container resources.")
    liveness_port: int = Field(8080, ge=1, le=65535, alias="livenessPort", description="Container port of /healthz.")
    metrics: Metrics = Field(default_factory=Metrics, description="Operator metrics.")
    prometheus_rule: PrometheusRule = Field(default_factory=PrometheusRule, alias="prometheusRule",
                                            description="Alerting rules.")
    dashboard: Dashboard = Field(default_factory=Dashboard, description="Grafana dashboard.")
    kube_state_metrics: KubeStateMetrics = Field(default_factory=KubeStateMetrics, alias="kubeStateMetrics",
                                                 description="kube-state-metrics config for PDInferenceServices.")
    pod_annotations: dict[str, str] = Field(default_factory=dict, alias="podAnnotations", description="Operator pod annotations.")
    pod_labels: dict[str, str] = Field(default_factory=dict, alias="podLabels", description="Extra operator pod labels.")
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector", description="Operator pod nodeSelector.")
    tolerations: list[dict] = Field(default_factory=list, description="Operator pod tolerations.")
    affinity: dict = Field(default_factory=dict, description="Operator pod affinity. Empty: the replicas prefer "
                                                             "different nodes (podAntiAffinity on the hostname).")
    priority_class_name: str = Field("", alias="priorityClassName", description="Operator pod priorityClassName.")
    global_: dict = Field(default_factory=dict, alias="global", description="Helm global values (unused; allowed for parent charts).")


# -- values.schema.json -----------------------------------------------------------


def _strip(node):
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _inline(node, defs):
    if isinstance(node, dict):
        if "$ref" in node:
            target = _inline(defs[node["$ref"].split("/")[-1]], defs)
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return {**target, **extra}
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def values_schema() -> dict:
    raw = Values.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    schema = _strip(_inline(raw, defs))
    return {"$schema": "http://json-schema.org/draft-07/schema#", **schema}


def values_schema_json() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=False) + "\n"


# -- values.yaml --------------------------------------------------------------------


def _comment(text: str, indent: str, width: int = 88) -> list[str]:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(indent) + 2 + len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    if line:
        lines.append(line)
    return [f"{indent}# {ln}" for ln in lines]


def _scalar_yaml(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _model_yaml(model: type[BaseModel], instance: BaseModel, indent: str) -> list[str]:
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        value = getattr(instance, name)
        out += _comment(field.description or key, indent)
        if isinstance(value, BaseModel):
            out.append(f"{indent}{key}:")
            out += _model_yaml(type(value), value, indent + "  ")
        elif isinstance(value, dict) and value:
            out.append(f"{indent}{key}:")
            for k, v in value.items():
                out.append(f"{indent}  {_scalar_yaml(k)}: {_scalar_yaml(v)}")
        else:
            out.append(f"{indent}{key}: {_scalar_yaml(value)}")
    return out


def values_yaml() -> str:
    return HEADER + "\n".join(_model_yaml(Values, Values(), "")) + "\n"


# -- README configuration table --------------------------------------------------------

TABLE_BEGIN = "<!-- values table: generated by `pdctl chart` -->"
TABLE_END = "<!-- end of values table -->"


def _rows(model: type[BaseModel], instance: BaseModel, prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        value = getattr(instance, name)
        if isinstance(value, BaseModel):
            rows += _rows(type(value), value, key + ".")
        else:
            shown = json.dumps(value) if not isinstance(value, str) else (f'"{value}"' if value else '""')
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{key}` | `{shown}` | {desc} |")
    return rows


def values_table() -> str:
    lines = ["| Key | Default | Description |", "|---|---|---|", *_rows(Values, Values(), "")]
    return "\n".join([TABLE_BEGIN, *lines, TABLE_END])


def readme_with_table(readme: str) -> str:
    """``readme`` with its values table replaced by the current one."""
    start, end = readme.index(TABLE_BEGIN), readme.index(TABLE_END) + len(TABLE_END)
    return readme[:start] + values_table() + readme[end:]


# -- templates/_defaults.tpl -----------------------------------------------------------

DEFAULTS_TPL = "templates/_defaults.tpl"


def defaults_tpl() -> str:
    """The chart's defaults for the templates themselves: ``helm upgrade --reuse-values``
    replaces the new chart's values.yaml with the old release's coalesced values (helm
    pkg/action/upgrade.go reuseValues: ``chart.Values = oldVals``), so a key added since
    that release is missing, and a template reading it failed (nil pointer) or rendered
    an empty field. Every template first fills what is missing from these."""
    defaults = json.dumps(Values().model_dump(by_alias=True, mode="json"), sort_keys=True, separators=(",", ":"))
    return "\n".join([
        "{{- /*", HEADER.strip().lstrip("# "),
        "The chart's default values (values.yaml), for keys missing from .Values: helm upgrade",
        "--reuse-values renders with the previous release's values only (helm pkg/action/upgrade.go",
        "reuseValues), so a key added to the chart since is absent. Every template starts with",
        '`include "pd-operator.fillDefaults" .`, which adds each missing key (recursively) and',
        "changes nothing that is set: unlike sprig's merge, a false, 0 or empty value stays. */ -}}",
        '{{- define "pd-operator.defaults" -}}',
        defaults,
        "{{- end -}}",
        "",
        '{{- define "pd-operator.fillDefaults" -}}',
        '{{- include "pd-operator.fillMissing" (list .Values (include "pd-operator.defaults" . | fromJson)) -}}',
        "{{- end -}}",
        "",
        '{{- define "pd-operator.fillMissing" -}}',
        "{{- $dst := index . 0 -}}",
        "{{- range $key, $value := index . 1 -}}",
        "{{- if not (hasKey $dst $key) -}}",
        "{{- $_ := set $dst $key $value -}}",
        '{{- else if and (kindIs "map" $value) (kindIs "map" (index $dst $key)) -}}',
        '{{- include "pd-operator.fillMissing" (list (index $dst $key) $value) -}}',
        "{{- end -}}",
        "{{- end -}}",
        "{{- end -}}",
        "",
    ])


# -- the files -----------------------------------------------------------------------


def generated_files() -> dict[str, str]:
    """Chart-relative path -> content."""
    return {
        "values.yaml": values_yaml(),
        "values.schema.json": values_schema_json(),
        "crds/pdinferenceservices.yaml": crd_yaml(),
        DEFAULTS_TPL: defaults_tpl(),
    }


def _with_readme(chart_dir: Path) -> dict[str, str]:
    files = generated_files()
    readme = chart_dir / "README.md"
    if readme.is_file() and TABLE_BEGIN in readme.read_text():
        files["README.md"] = readme_with_table(readme.read_text())
    return files


def stale(chart_dir: Path) -> list[str]:
    out = []
    for rel, text in _with_readme(chart_dir).items():
        path = chart_dir / rel
        if not path.is_file() or path.read_text() != text:
            out.append(rel)
    return out


def write(chart_dir: Path) -> list[str]:
    written = []
    for rel, text in _with_readme(chart_dir).items():
        path = chart_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(rel)
    return written


APP_VERSION = __version__
