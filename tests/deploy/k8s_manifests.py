"""Reading deploy/k8s for the tests: the YAML files, the kustomize builds, each suite container's command
line with the values Kubernetes substitutes for `$(NAME)`. Kept apart from the checks so they stay short."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KUSTOMIZATION = "kustomization.yaml"
SUITE_IMAGE = "ocr-capacity"  # the image deploy/Dockerfile builds; the kustomizations point it at a registry
WORKLOADS = ("Job", "Deployment", "DaemonSet", "Pod")


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def kustomize_dirs() -> list[Path]:
    return sorted(p.parent for p in K8S.rglob(KUSTOMIZATION))


def rel(path: Path) -> str:
    return path.relative_to(K8S).as_posix()


def patch_files() -> set[Path]:
    """Files used as patches: partial objects, checked once applied (in the build that applies them)."""
    found = set()
    for folder in kustomize_dirs():
        for patch in load(folder / KUSTOMIZATION)[0].get("patches", []):
            if "path" in patch:
                found.add((folder / patch["path"]).resolve())
    return found


def raw_objects() -> list[tuple[Path, dict[str, Any]]]:
    """Every object written in a YAML file under deploy/k8s (kustomizations and patches left out)."""
    patches = patch_files()
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name != KUSTOMIZATION and path.resolve() not in patches:
            out += [(path, obj) for obj in load(path)]
    return out


def kubectl() -> str | None:
    return shutil.which("kubectl")


@functools.cache
def build(folder: Path) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize FOLDER`: what `kubectl apply -k FOLDER` would send."""
    exe = kubectl()
    assert exe, "kubectl not found"
    done = subprocess.run([exe, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize {rel(folder)}: {done.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def buildable_dirs() -> list[Path]:
    """Kustomizations (not Components: those are built through the example that uses them)."""
    return [d for d in kustomize_dirs() if load(d / KUSTOMIZATION)[0].get("kind") != "Component"]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] in WORKLOADS:
        return obj["spec"]["template"]["spec"]
    return None


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    return (
        obj["metadata"].get("labels", {})
        if obj["kind"] == "Pod"
        else obj["spec"]["template"]["metadata"]["labels"]
    )


def one(objs: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Container:
    owner: str  # kind/name of the object that runs it
    spec: dict[str, Any]
    env: dict[str, str]  # every variable Kubernetes would set, with its value ("" for a secret)
    env_names: tuple[str, ...]

    @property
    def is_suite(self) -> bool:
        return str(self.spec.get("image", "")).split("/")[-1].split(":")[0] == SUITE_IMAGE

    @property
    def args(self) -> list[str]:
        return [expand(str(a), self.env) for a in self.spec.get("args", [])]

    @property
    def references(self) -> set[str]:
        """The $(NAME)s in the command line."""
        text = " ".join(str(a) for a in self.spec.get("command", []) + self.spec.get("args", []))
        return set(_REF.findall(text.replace("$$", "")))


def containers(objs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[Container]:
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    out = []
    for obj in objs:
        spec = pod_spec(obj)
        for c in (spec or {}).get("containers", []):
            env: dict[str, str] = {}
            for source in c.get("envFrom", []):  # envFrom first; env entries win (as in Kubernetes)
                env.update(config_maps[source["configMapRef"]["name"]])
            for var in c.get("env", []):
                env[var["name"]] = _value(var, config_maps)
            out.append(Container(f"{obj['kind']}/{obj['metadata']['name']}", c, env, tuple(env)))
    return out


def _value(var: dict[str, Any], config_maps: dict[str, dict[str, str]]) -> str:
    if "value" in var:
        return str(var["value"])
    ref = var["valueFrom"]
    if "configMapKeyRef" in ref:
        return config_maps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
    return ""  # a secret: its value never matters to a check


_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' rule for command and args: $(NAME) becomes NAME's value when NAME is set, and stays as
    written otherwise; $$ is a literal $."""

    def one_ref(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one_ref, text)
