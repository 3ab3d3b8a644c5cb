#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline, against the real schemas.

    kubectl kustomize deploy/kubernetes/base > rendered.yaml
    python3 deploy/kubernetes/validate.py rendered.yaml

- Built-in kinds (Namespace, DaemonSet, Service, ...): `kubernetes-validate` (PyPI), which
  bundles the OpenAPI schemas of every Kubernetes release it knows, in strict mode (unknown
  fields are errors), against the oldest and the newest release checked below.
- Prometheus Operator kinds (ServiceMonitor, PrometheusRule): the pydantic models of
  `cloudcoil-models-prometheus-operator` (PyPI), generated from the operator's CRDs: types,
  required fields and enums are checked by the model, and a field the CRD does not define is
  an error (the model would drop it silently, so the object is compared with what the model
  keeps).

Exit status 0 when every object validates, 1 otherwise. Used by agent/tests/deploy.rs; the
packages come from `cargo xtask setup` (target/tools/k8s-venv).
"""

import sys

import yaml

import kubernetes_validate
from cloudcoil.models.prometheus_operator import v1 as promop

# The oldest release whose schema has what the DaemonSet uses (securityContext.appArmorProfile
# is GA in 1.30), and the newest the installed kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

CRD_MODELS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): promop.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): promop.PrometheusRule,
}


def unknown_fields(given, kept, path=""):
    """Paths present in `given` but not in `kept` (what the model understood)."""
    out = []
    if isinstance(given, dict):
        for key, value in given.items():
            p = f"{path}.{key}" if path else key
            if not isinstance(kept, dict) or key not in kept:
                out.append(p)
            else:
                out.extend(unknown_fields(value, kept[key], p))
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (g, k) in enumerate(zip(given, kept)):
            out.extend(unknown_fields(g, k, f"{path}[{i}]"))
    return out


def validate(doc):
    """Errors for one object (empty when valid)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    errors = []
    if key in CRD_MODELS:
        model = CRD_MODELS[key]
        try:
            obj = model.model_validate(doc)
        except Exception as e:  # pydantic.ValidationError
            return [f"{name}: {e}"]
        kept = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
        for p in unknown_fields(doc, kept):
            errors.append(f"{name}: field {p} is not in the {key[1]} CRD")
        if not errors:
            print(f"ok: {name} ({key[0]}, cloudcoil-models-prometheus-operator)")
        return errors
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            errors.append(f"{name} (Kubernetes {version}, strict): {where}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{name}: no schema for {key} in Kubernetes {version}: {e}")
    if not errors:
        print(f"ok: {name} ({key[0]}, Kubernetes {' and '.join(K8S_VERSIONS)}, strict)")
    return errors


def main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if not docs:
        print("no objects")
        return 1
    errors = []
    for doc in docs:
        errors.extend(validate(doc))
    for e in errors:
        print("error: " + e)
    print(f"{len(docs)} objects, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
