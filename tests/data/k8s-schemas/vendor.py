"""Regenerate the vendored Kubernetes schemas in this folder (README.md says from what, at which commit).

    python tests/data/k8s-schemas/vendor.py --core DIR --crd CRD.yaml [--crd ...]

``--core``: a ``v1.37.0-local-strict`` folder of the kubernetes-validate wheel (PyPI, 1.37.0): its
ConfigMap, PersistentVolumeClaim and PodTemplateSpec schemas with every definition they reach (and ObjectMeta),
written as one file, ``core-v1.37.json``, whose ``$defs`` hold them by name. ``--crd``: an operator's CRD YAML: the
``openAPIV3Schema`` of its stored version, written as ``<group>-<kind>-<version>.json``. Two changes, both
mechanical: ``description`` annotations are dropped (they are most of the bytes and validate nothing), and the CRD
schemas are closed the way the core ``-strict`` schemas are (``additionalProperties: false`` on every object
schema that lists its properties and neither allows more nor preserves unknown fields), because the API server
rejects unknown fields under kubectl's default ``--validate=strict`` instead of accepting them.
Written by hand: there is no packaged tool that vendors a subset of these schemas (kubernetes-validate ships all
of them, 1.8 MB per version, and no CRDs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CORE_ROOTS = {"ConfigMap": "configmap-v1.json", "PersistentVolumeClaim": "persistentvolumeclaim-v1.json",
              "PodTemplateSpec": "podtemplatespec-v1.json"}  # fmt: skip
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def slim(node: Any, *, close: bool, in_properties: bool = False) -> Any:
    """``node`` without ``description`` annotations (a property named description stays), and with
    ``additionalProperties: false`` added to object schemas when ``close``."""
    if isinstance(node, list):
        return [slim(item, close=close) for item in node]
    if not isinstance(node, dict):
        return node
    if in_properties:  # keys are property names, values schemas
        return {name: slim(schema, close=close) for name, schema in node.items()}
    out = {key: slim(value, close=close, in_properties=key in ("properties", "patternProperties", "$defs"))
           for key, value in node.items() if key not in ("description", "$schema", "$id")}  # fmt: skip
    if close and "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):  # fmt: skip
        out["additionalProperties"] = False
    return out


def references(node: Any, found: set[str]) -> None:
    """Add the definition names of every ``$ref`` under ``node`` to ``found``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                found.add(value.rsplit("/", 1)[-1])
            else:
                references(value, found)
    elif isinstance(node, list):
        for item in node:
            references(item, found)


def vendor_core(folder: Path) -> Path:
    """Write core-v1.37.json from the kubernetes-validate schema folder; return its path."""
    definitions = json.loads((folder / "_definitions.json").read_text())["$defs"]
    roots = {name: json.loads((folder / file).read_text()) for name, file in CORE_ROOTS.items()}
    todo, seen = {OBJECT_META}, set()
    for schema in roots.values():
        references(schema, todo)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            references(definitions[name], todo)
    defs = {name: definitions[name] for name in sorted(seen)} | roots
    text = json.dumps(slim(defs, close=False, in_properties=True), sort_keys=True, separators=(",", ":"))
    text = text.replace('"/api/_definitions.json#/$defs/', '"#/$defs/')
    out = HERE / "core-v1.37.json"
    out.write_text(json.dumps({"$schema": DRAFT, "$comment": f"kubernetes-validate 1.37.0 {folder.name}",
                               "$defs": json.loads(text)}, sort_keys=True, separators=(",", ":")) + "\n")  # fmt: skip
    return out


def vendor_crd(crd_file: Path) -> Path:
    """Write the stored version's openAPIV3Schema of ``crd_file``, slimmed and closed; return its path."""
    crd = yaml.safe_load(crd_file.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema = slim(version["schema"]["openAPIV3Schema"], close=True)
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    out = HERE / f"{group}-{kind.lower()}-{version['name']}.json"
    body = {"$schema": DRAFT, "$comment": f"{crd['metadata']['name']} {version['name']}", **schema}
    out.write_text(json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core", type=Path, required=True, help="kubernetes-validate's v1.37.0-local-strict folder")
    parser.add_argument("--crd", type=Path, action="append", default=[], help="a CRD YAML (repeat)")
    args = parser.parse_args()
    for path in [vendor_core(args.core), *(vendor_crd(crd) for crd in args.crd)]:
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
