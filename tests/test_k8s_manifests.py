"""deploy/k8s/ validates offline against the resources' own schemas, vendored in tests/data/k8s-schemas/.

Every document of every manifest is checked against the schema of its kind: the Kubeflow CRDs' openAPIV3Schema
(kubeflow/trainer v1.9.4 for PyTorchJob, v2.3.0 for TrainJob and TrainingRuntime) and the Kubernetes 1.37 strict
schemas (ConfigMap, PersistentVolumeClaim; the metadata of every document; each pod template inside the jobs), as
the API server would before storing them. A failure names the file, the document and the path. No cluster can run
here, and kubeconform (the usual tool) is in none of the package lists these machines reach (PyPI, npm, Debian):
the jsonschema library does the checking.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
SCHEMAS = ROOT / "tests" / "data" / "k8s-schemas"
CRDS = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org-pytorchjob-v1.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org-trainjob-v1alpha1.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer.kubeflow.org-trainingruntime-v1alpha1.json",
}
RENDER = ROOT / "deploy" / "k8s" / "render.sh"
# a render group id unlike the 109 the manifests once hard-coded (Fedora and Arch hosts give render 992 or 993)
RENDER_GID = "993"
JOBS = [ROOT / "deploy" / "k8s" / name for name in ("pytorchjob.yaml", "trainjob.yaml")]
CORE = {("v1", "ConfigMap"): "ConfigMap", ("v1", "PersistentVolumeClaim"): "PersistentVolumeClaim"}


@functools.cache
def _schema(file: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / file).read_text())


@functools.cache
def _core(name: str) -> jsonschema.Draft202012Validator:
    """A validator for the core type ``name`` (a $defs entry of core-v1.37.json), its references resolved there."""
    return jsonschema.Draft202012Validator({**_schema("core-v1.37.json"), "$ref": f"#/$defs/{name}"})


@functools.cache
def _crd(file: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema(file))


def pod_templates(doc: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(path, pod template) for each pod template inside a job document."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "PyTorchJob":
        for role, replica in (spec.get("pytorchReplicaSpecs") or {}).items():
            yield f"/spec/pytorchReplicaSpecs/{role}/template", (replica or {}).get("template")
    if doc.get("kind") == "TrainingRuntime":
        for i, job in enumerate(((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []):
            yield f"/spec/template/spec/replicatedJobs/{i}/template/spec/template", job["template"]["spec"]["template"]


def violations(doc: Any) -> list[str]:
    """Every schema violation of one manifest document, as ``path: message``; [] when it is valid."""
    if not isinstance(doc, dict):
        return [f"/: a document must be a mapping, not {type(doc).__name__}"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRDS:
        checks = [
            ("", _crd(CRDS[key]), doc),
            ("/metadata", _core("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), doc.get("metadata", {})),
        ]
        checks += [(path, _core("PodTemplateSpec"), template) for path, template in pod_templates(doc)]
    elif key in CORE:
        checks = [("", _core(CORE[key]), doc)]
    else:
        return [f"/: no vendored schema for apiVersion {key[0]!r} kind {key[1]!r} (tests/data/k8s-schemas/README.md)"]
    found = []
    for prefix, validator, instance in checks:
        for error in validator.iter_errors(instance):
            path = prefix + "".join(f"/{part}" for part in error.absolute_path)
            found.append(f"{path or '/'}: {error.message}")
    return sorted(set(found))


def render(path: Path, render_gid: str | None) -> subprocess.CompletedProcess[str]:
    """deploy/k8s/render.sh run on ``path`` with RENDER_GID set to ``render_gid`` (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != "RENDER_GID"}
    env |= {} if render_gid is None else {"RENDER_GID": render_gid}
    return subprocess.run(["bash", str(RENDER), str(path)], env=env, capture_output=True, text=True, check=False)


def documents(path: Path) -> list[Any]:
    """The documents of one manifest file as applied (YAML anchors resolved, as kubectl resolves them): a manifest
    with the ${RENDER_GID} placeholder goes through deploy/k8s/render.sh first, with a GID no default has."""
    text = path.read_text()
    if "${RENDER_GID}" in text:
        done = render(path, RENDER_GID)
        assert done.returncode == 0, done.stderr
        text = done.stdout
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def test_manifests_are_there() -> None:
    """The manifests the docs name exist (a glob that found nothing would validate nothing)."""
    assert {p.name for p in MANIFESTS} >= {"common.yaml", "pytorchjob.yaml", "trainjob.yaml"}


@pytest.mark.parametrize("file", ["core-v1.37.json", *CRDS.values()])
def test_vendored_schemas_are_schemas(file: str) -> None:
    """Each vendored file is a valid JSON Schema (2020-12) whose references all resolve: a broken regeneration
    (tests/data/k8s-schemas/vendor.py) fails here rather than passing every manifest."""
    jsonschema.Draft202012Validator.check_schema(_schema(file))
    refs: set[str] = set()
    _refs(_schema(file), refs)
    defs = _schema(file).get("$defs", {})
    assert all(ref.startswith("#/$defs/") and ref.removeprefix("#/$defs/") in defs for ref in refs), refs


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        found.update([node["$ref"]] if isinstance(node.get("$ref"), str) else [])
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for item in node:
            _refs(item, found)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_document_validates(path: Path) -> None:
    """Each document of deploy/k8s/<file> against its kind's vendored schema; the failure names file, document,
    path."""
    problems = [f"{path.relative_to(ROOT)} document {i} ({doc.get('kind')} {doc.get('metadata', {}).get('name')}) "
                f"{problem}" for i, doc in enumerate(documents(path), 1) for problem in violations(doc)]  # fmt: skip
    assert not problems, "\n".join(problems)


def _job(kind: str) -> dict[str, Any]:
    name = {"PyTorchJob": "pytorchjob.yaml", "TrainJob": "trainjob.yaml", "TrainingRuntime": "trainjob.yaml",
            "PersistentVolumeClaim": "common.yaml"}[kind]  # fmt: skip
    return copy.deepcopy(next(d for d in documents(ROOT / "deploy" / "k8s" / name) if d["kind"] == kind))


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    return next(template for _, template in pod_templates(doc))["spec"]


def _string_replicas(doc: dict[str, Any]) -> None:
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "2"


def _unknown_container_field(doc: dict[str, Any]) -> None:
    _pod(doc)["containers"][0]["resource"] = {"limits": {"amd.com/gpu": 8}}  # a typo of resources


def _unknown_pod_field(doc: dict[str, Any]) -> None:
    _pod(doc)["ipc"] = "host"  # compose's key; a pod spec has hostIPC


def _no_container_name(doc: dict[str, Any]) -> None:
    del _pod(doc)["containers"][0]["name"]


def _no_runtime_name(doc: dict[str, Any]) -> None:
    del doc["spec"]["runtimeRef"]["name"]


def _string_num_nodes(doc: dict[str, Any]) -> None:
    doc["spec"]["trainer"]["numNodes"] = "two"


def _unknown_pvc_field(doc: dict[str, Any]) -> None:
    doc["spec"]["accessMode"] = ["ReadWriteMany"]


def _bad_metadata(doc: dict[str, Any]) -> None:
    doc["metadata"]["label"] = {"app": "x"}  # a typo of labels: the CRD schema leaves metadata to ObjectMeta's


MUTATIONS = [
    ("PyTorchJob", _string_replicas, "/spec/pytorchReplicaSpecs/Worker/replicas"),
    ("PyTorchJob", _unknown_container_field, "/spec/pytorchReplicaSpecs/Master/template/spec/containers/0"),
    ("PyTorchJob", _unknown_pod_field, "/spec/pytorchReplicaSpecs/Master/template/spec"),
    ("PyTorchJob", _bad_metadata, "/metadata"),
    (
        "TrainingRuntime",
        _no_container_name,
        "/spec/template/spec/replicatedJobs/0/template/spec/template/spec/containers/0",
    ),
    ("TrainJob", _no_runtime_name, "/spec/runtimeRef"),
    ("TrainJob", _string_num_nodes, "/spec/trainer/numNodes"),
    ("PersistentVolumeClaim", _unknown_pvc_field, "/spec"),
]


@pytest.mark.parametrize(("kind", "mutate", "where"), MUTATIONS, ids=[m[1].__name__.strip("_") for m in MUTATIONS])
def test_a_broken_manifest_fails_at_its_path(kind: str, mutate: Any, where: str) -> None:
    """A string for a number, an unknown field where the schema forbids it, a missing required key: each shipped
    document, broken once, fails, and the failure names the path of the break (the unbroken one passes)."""
    doc = _job(kind)
    assert violations(doc) == []
    mutate(doc)
    problems = violations(doc)
    assert problems, f"{mutate.__name__} on {kind} passed validation"
    assert any(p.split(": ", 1)[0] == where for p in problems), problems


def test_an_unknown_kind_is_named() -> None:
    """A document of a kind with no vendored schema fails naming the kind, instead of passing unchecked."""
    assert violations({"apiVersion": "batch/v1", "kind": "Job"}) == [
        "/: no vendored schema for apiVersion 'batch/v1' kind 'Job' (tests/data/k8s-schemas/README.md)"
    ]


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_render_gid_lands_in_every_pod(path: Path) -> None:
    """deploy/k8s/render.sh with RENDER_GID=993 gives every pod of the job the groups video (44) and 993, and the
    rendered job validates; no other line of the manifest changes."""
    docs = documents(path)
    templates = [template for doc in docs for _, template in pod_templates(doc)]
    assert templates, f"no pod template in {path.name}"
    assert [t["spec"]["securityContext"]["supplementalGroups"] for t in templates] == [[44, 993]] * len(templates)
    assert all(violations(doc) == [] for doc in docs)
    rendered, raw = render(path, RENDER_GID).stdout.splitlines(), path.read_text().splitlines()
    assert [(a, b) for a, b in zip(raw, rendered, strict=True) if a != b] == [
        (line, line.replace("${RENDER_GID}", "993")) for line in raw if "${RENDER_GID}" in line
    ]


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_an_unrendered_job_is_refused_at_its_groups(path: Path) -> None:
    """Applied without render.sh, the placeholder is a string where the schema wants an integer: refused at
    supplementalGroups, instead of a pod that starts without the node's render group."""
    problems = [p for doc in yaml.safe_load_all(path.read_text()) if doc for p in violations(doc)]
    assert problems
    assert all(p.split(": ", 1)[0].endswith("/securityContext/supplementalGroups/1") for p in problems), problems


@pytest.mark.parametrize(
    ("value", "says"),
    [(None, "RENDER_GID is not set"), ("", "RENDER_GID is not set"), ("render", "RENDER_GID=render is not a group id"),
     ("-1", "RENDER_GID=-1 is not"), ("2147483648", "RENDER_GID=2147483648 is not"), ("0993", "RENDER_GID=0993")],
)  # fmt: skip
def test_a_bad_render_gid_is_refused(value: str | None, says: str) -> None:
    """Unset, empty, a name, negative, past Kubernetes' maximum GID (2^31 - 1) or a leading zero: exit 2, a message
    naming RENDER_GID and how to read it on the node, and nothing on stdout for kubectl to apply."""
    done = render(JOBS[0], value)
    assert (done.returncode, done.stdout) == (2, "")
    assert says in done.stderr and "stat -c %g /dev/kfd" in done.stderr, done.stderr


def test_render_refuses_a_file_without_the_placeholder(tmp_path: Path) -> None:
    """common.yaml has no pod: rendering it is a mistake, said so (exit 2), not a silent copy."""
    done = render(ROOT / "deploy" / "k8s" / "common.yaml", RENDER_GID)
    assert (done.returncode, done.stdout) == (2, "")
    assert "has no ${RENDER_GID} placeholder" in done.stderr
    missing = render(tmp_path / "nope.yaml", RENDER_GID)
    assert (missing.returncode, missing.stdout) == (2, "") and "nope.yaml: no such readable file" in missing.stderr
