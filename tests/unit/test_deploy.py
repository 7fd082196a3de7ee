"""deploy/: what can be checked without a container engine or a cluster.

Every YAML parses; the Kubernetes manifests carry what an operator relies on (probes, resources, a
non-root security context); every OSTE_* name in any file is a setting `oste settings` lists; every
`oste …` command the files run exists; the Dockerfile is multi-stage, non-root, health-checked and
enters through `oste`; the systemd units pass `systemd-analyze verify` (or parse, where it is missing).
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from oste.settings import SETTINGS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
OSTE = str(Path(sys.executable).parent / "oste")
UNITS = ("oste.service", "oste-api.service", "oste-worker@.service")
SETTING_NAMES = {spec.env for spec in SETTINGS}
OSTE_NAME = re.compile(r"\bOSTE_[A-Z_]+\b")


def yaml_files() -> list[Path]:
    return sorted([DEPLOY / "compose.yaml", *KUBERNETES.glob("*.yaml")])


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted(KUBERNETES.glob("*.yaml")) for doc in documents(path)]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests() if m["kind"] == kind}


def test_the_files_are_there() -> None:
    names = {p.name for p in DEPLOY.iterdir()}
    assert {"Dockerfile", "compose.yaml", "README.md", "kubernetes", *UNITS} <= names


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: p.name)
def test_every_yaml_parses(path: Path) -> None:
    assert documents(path), f"{path.name} holds no document"


def test_every_manifest_has_kind_api_version_and_name() -> None:
    for manifest in manifests():
        if manifest["kind"] == "Kustomization":
            continue
        assert manifest["apiVersion"] and manifest["metadata"]["name"], manifest


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = documents(KUBERNETES / "kustomization.yaml")
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def pod_specs() -> dict[str, dict[str, Any]]:
    workloads = of_kind("Deployment")
    return {name: w["spec"]["template"]["spec"] for name, w in workloads.items()}


def test_the_workloads_are_there() -> None:
    assert set(of_kind("Deployment")) == {"oste-api", "oste-worker"}
    assert not of_kind("Job")  # a Job's template is immutable: re-applying a new image would fail
    assert set(of_kind("Service")) == {"oste-api"} and set(of_kind("Ingress")) == {"oste-api"}
    assert set(of_kind("PodDisruptionBudget")) == {"oste-api", "oste-worker"}
    assert set(of_kind("ConfigMap")) == {"oste-config"} and set(of_kind("Secret")) == {"oste-secrets"}
    (hpa,) = of_kind("HorizontalPodAutoscaler").values()
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "oste-api"}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert hpa["spec"]["minReplicas"] >= 2


@pytest.mark.parametrize("name", ["oste-api", "oste-worker"])
def test_pods_run_as_non_root_with_requests_and_limits(name: str) -> None:
    spec = pod_specs()[name]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        resources = container["resources"]
        for kind in ("cpu", "memory"):
            assert resources["requests"][kind] and resources["limits"][kind], (name, kind)


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


@pytest.mark.parametrize(("name", "resident_mb"), [("oste-api", 76), ("oste-worker", 68)])
def test_memory_is_sized_above_the_measured_resident_size(name: str, resident_mb: float) -> None:
    # docs/benchmarks.md: workers ~57-68 MB resident, `oste api` ~76 MB; a request below that
    # would schedule pods onto nodes that cannot hold them, a limit near it would OOM-kill them.
    (container,) = pod_specs()[name]["containers"]
    resources = container["resources"]
    resident_mib = resident_mb * 1e6 / 2**20
    assert mebibytes(resources["requests"]["memory"]) >= resident_mib
    assert mebibytes(resources["limits"]["memory"]) >= 3 * resident_mib


def test_the_api_is_probed_on_readyz_and_healthz() -> None:
    (container,) = pod_specs()["oste-api"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = container["readinessProbe"]["httpGet"]["port"]
    assert port in {p["name"] for p in container["ports"]}


def test_the_worker_is_probed_on_its_metrics_port() -> None:
    # `oste worker` serves /metrics, /healthz and /readyz on OSTE_METRICS_PORT only (unset: no port,
    # and a probe would fail forever): the ConfigMap sets it, on every interface, to the probed port.
    (container,) = pod_specs()["oste-worker"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (port,) = container["ports"]
    assert container["readinessProbe"]["httpGet"]["port"] == port["name"]
    assert container["livenessProbe"]["httpGet"]["port"] == port["name"]
    (config,) = [m for m in manifests() if m["kind"] == "ConfigMap"]
    assert int(config["data"]["OSTE_METRICS_PORT"]) == port["containerPort"]
    assert {"name": "OSTE_HOST", "value": "0.0.0.0"} in container["env"]


def test_metrics_are_scraped_on_the_metrics_port_which_no_service_exposes() -> None:
    # /metrics names every tenant: on the API port it needs the admin token or OSTE_METRICS_TOKEN; the
    # pods serve it without credentials on OSTE_METRICS_PORT, which Prometheus scrapes pod by pod and
    # which the Service (the public way in) does not expose.
    (config,) = [m for m in manifests() if m["kind"] == "ConfigMap"]
    port = int(config["data"]["OSTE_METRICS_PORT"])
    for name, deployment in of_kind("Deployment").items():
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert int(annotations["prometheus.io/port"]) == port
        assert annotations["prometheus.io/path"] == "/metrics"
        (container,) = pod_specs()[name]["containers"]
        assert {"name": "metrics", "containerPort": port} in container["ports"], name
    for service in of_kind("Service").values():
        assert {p["targetPort"] for p in service["spec"]["ports"]}.isdisjoint({"metrics", port})


def env_names_in_manifests() -> set[str]:
    names: set[str] = set()
    for manifest in manifests():
        if manifest["kind"] in ("ConfigMap", "Secret"):
            names |= set(manifest.get("data", {})) | set(manifest.get("stringData", {}))
    for spec in pod_specs().values():
        for container in spec["containers"]:
            names |= {e["name"] for e in container.get("env", [])}
    return names


def env_names_in_compose() -> set[str]:
    (compose,) = documents(DEPLOY / "compose.yaml")
    names: set[str] = set()
    for name, service in compose["services"].items():
        if name != "postgres":
            names |= set(service["environment"])
    return names


def test_every_environment_name_is_a_setting() -> None:
    listed = subprocess.run([OSTE, "settings"], capture_output=True, text=True, check=True).stdout
    from_cli = {line.split()[0] for line in listed.splitlines() if line.strip()}
    assert from_cli == SETTING_NAMES
    used = env_names_in_manifests() | env_names_in_compose()
    assert used and used <= SETTING_NAMES, used - SETTING_NAMES
    for path in [*DEPLOY.iterdir(), *KUBERNETES.iterdir()]:
        if path.is_file():
            unknown = set(OSTE_NAME.findall(path.read_text())) - SETTING_NAMES
            assert not unknown, f"{path.name} names {unknown}, which `oste settings` does not list"


def commands_run() -> set[tuple[str, str]]:
    """(file, oste subcommand) for every command the deployment files run."""
    found: set[tuple[str, str]] = set()
    for name, spec in pod_specs().items():
        for container in spec["containers"]:
            found.add((name, container["args"][0]))
    (compose,) = documents(DEPLOY / "compose.yaml")
    for name, service in compose["services"].items():
        if name != "postgres":
            found.add((f"compose {name}", service["command"][0]))
    for unit in UNITS:
        for line in (DEPLOY / unit).read_text().splitlines():
            match = re.match(r"ExecStart(?:Pre)?=\S*/oste (\w+)", line)
            if match:
                found.add((unit, match.group(1)))
    found.add(("Dockerfile CMD", _dockerfile_instructions()["CMD"][-1].strip('[]" ')))
    return found


def test_every_command_the_files_run_exists() -> None:
    commands = commands_run()
    assert {c for _, c in commands} >= {"serve", "api", "worker", "migrate"}
    # One start of the installed `oste` lists every command (each start imports the whole engine: a
    # `--help` per file took over a minute on a busy machine).
    result = subprocess.run([OSTE, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"^ {4}([a-z][a-z-]*)\b", result.stdout, re.M))
    assert "serve" in listed, result.stdout
    for where, command in commands:
        assert command in listed, f"{where}: `oste {command}` does not exist: {sorted(listed)}"


def _dockerfile_instructions() -> dict[str, list[str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    instructions: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.setdefault(keyword.upper(), []).append(rest.strip())
    return instructions


def test_the_dockerfile_is_multi_stage_non_root_health_checked_and_enters_through_oste() -> None:
    instructions = _dockerfile_instructions()
    stages = instructions["FROM"]
    assert len(stages) >= 2 and all(re.match(r"python:3\.1\d-slim\b", s) for s in stages)
    assert any("--from=build" in c for c in instructions["COPY"])
    (user,) = instructions["USER"]
    assert user.split(":")[0] not in {"root", "0"}
    (check,) = instructions["HEALTHCHECK"]
    assert "/healthz" in check and "CMD" in check
    assert instructions["ENTRYPOINT"] == ['["oste"]']
    env = " ".join(instructions["ENV"])
    assert "OSTE_HOST=0.0.0.0" in env  # a container listening on 127.0.0.1 is unreachable


def test_compose_runs_postgres_migrate_api_and_two_workers() -> None:
    (compose,) = documents(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert services["postgres"]["healthcheck"]["test"] and services["postgres"]["volumes"]
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for role in ("api", "worker"):
        assert services[role]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["deploy"]["replicas"] == 2
    worker_check = " ".join(services["worker"]["healthcheck"]["test"])
    port = services["worker"]["environment"]["OSTE_METRICS_PORT"]
    assert f"127.0.0.1:{port}/healthz" in worker_check  # the worker's own health endpoint
    assert services["api"]["environment"]["OSTE_DATABASE_URL"].startswith("postgres://")


def test_compose_requires_a_database_password_and_tags_a_version() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    assert "${POSTGRES_PASSWORD:?" in text and "POSTGRES_PASSWORD:-" not in text
    (compose,) = documents(DEPLOY / "compose.yaml")
    images = {svc["image"] for name, svc in compose["services"].items() if name != "postgres"}
    assert images and not any(image.endswith(":latest") or ":" not in image for image in images), images


def test_the_kustomization_pins_the_release_version_and_the_ingress_is_tls_only() -> None:
    (kustomization,) = documents(KUBERNETES / "kustomization.yaml")
    (image,) = kustomization["images"]
    version = re.search(r'^version = "([^"]+)"', (DEPLOY.parent / "pyproject.toml").read_text(), re.M)
    assert version is not None and image["newTag"] == version.group(1) != "latest"
    (ingress,) = of_kind("Ingress").values()
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    assert hosts <= {h for tls in ingress["spec"]["tls"] for h in tls["hosts"]}
    paths = {p["path"]: p["backend"]["service"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]}
    assert {"/v1", "/ui"} <= set(paths) and not any(path.startswith("/metrics") for path in paths)
    assert all(backend == {"name": "oste-api", "port": {"name": "http"}} for backend in paths.values())
    (config,) = of_kind("ConfigMap").values()
    assert config["data"]["OSTE_FORWARDED_ALLOW_IPS"]  # the proxy's X-Forwarded-Proto is believed


HARDENING = ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths", "RestartSec")


def test_the_systemd_units_are_locked_down_alike() -> None:
    for unit in UNITS:
        parser = configparser.ConfigParser(strict=True, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string((DEPLOY / unit).read_text())
        service = parser["Service"]
        assert {name: service.get(name) for name in HARDENING} == {
            "NoNewPrivileges": "true",
            "ProtectSystem": "strict",
            "ProtectHome": "true",
            "PrivateTmp": "true",
            "ReadWritePaths": "/var/lib/oste",
            "RestartSec": "2",
        }, unit
        assert parser["Unit"]["Documentation"], unit


def _unit_copies(tmp_path: Path) -> list[Path]:
    """The units with ExecStart pointing at this venv's oste (verify checks the binary exists)."""
    copies = []
    for unit in UNITS:
        text = (DEPLOY / unit).read_text().replace("/opt/oste/.venv/bin/oste", OSTE)
        copy = tmp_path / unit.replace("@.", "@1.")
        copy.write_text(text)
        copies.append(copy)
    return copies


def test_systemd_units_verify(tmp_path: Path) -> None:
    copies = _unit_copies(tmp_path)
    for copy in copies:
        parser = configparser.ConfigParser(strict=True, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(copy.read_text())
        assert parser["Service"]["ExecStart"].split()[0] == OSTE
        assert parser["Service"]["User"] == "oste" and parser["Install"]["WantedBy"]
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the units were only parsed")
    result = subprocess.run(
        ["systemd-analyze", "verify", *map(str, copies)], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_systemd_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart=relative/oste api\nRestart=sometimes\n")
    result = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True)
    assert result.returncode != 0 or result.stderr.strip()


def rendered(tag: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of deploy/kubernetes with the image set to ``tag``."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        message = "kubectl is missing (Debian's kubernetes-client package provides it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip("SKIPPING the manifest rendering test — " + message)
    release = tmp_path / tag  # the manifests with the release's image, as an operator sets it
    shutil.copytree(KUBERNETES, release)
    (kustomization,) = documents(KUBERNETES / "kustomization.yaml")
    kustomization["images"] = [{"name": "oste", "newName": "registry.local/oste", "newTag": tag}]
    (release / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run([kubectl, "kustomize", str(release)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def test_a_new_release_re_applies_cleanly_and_migrates_before_its_code_starts(tmp_path: Path) -> None:
    old, new = rendered("1.4.0", tmp_path), rendered("1.5.0", tmp_path)
    assert [(d["kind"], d["metadata"]["name"]) for d in old] == [
        (d["kind"], d["metadata"]["name"]) for d in new
    ]
    assert not [d for d in new if d["kind"] == "Job"], "a Job cannot be re-applied with a new image"
    for deployment in (d for d in new if d["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        (init,) = spec["initContainers"]
        assert init["args"] == ["migrate"], deployment["metadata"]["name"]
        images = {c["image"] for c in [*spec["containers"], init]}
        assert images == {"registry.local/oste:1.5.0"}, (deployment["metadata"]["name"], images)
        assert {e["secretRef"]["name"] for e in init["envFrom"] if "secretRef" in e} == {"oste-secrets"}
