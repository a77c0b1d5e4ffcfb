"""The Kubernetes manifest of docs/SERVING.md passes Kubernetes' own schema, strictly (unknown fields are errors),
as the nightly's workflow passes actionlint; and the document shows the file as it is."""

import copy
import re

import kubernetes_validate
import pytest
import yaml

from conftest import ROOT

MANIFEST = ROOT / "examples" / "kubernetes" / "mmtrt-serve.yaml"
VERSION = kubernetes_validate.latest_version()


def documents():
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def test_the_manifest_passes_the_kubernetes_schema():
    kinds = [kubernetes_validate.validate(d, VERSION, strict=True) and d["kind"] for d in documents()]
    assert kinds == ["Deployment", "Service"]


def test_the_schema_check_catches_a_misspelt_field():
    deployment = copy.deepcopy(documents()[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/ready"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, VERSION, strict=True)


def test_serving_md_shows_the_manifest_file():
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "SERVING.md").read_text(), re.S)
    assert MANIFEST.read_text() in blocks
