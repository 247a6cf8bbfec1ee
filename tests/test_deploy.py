"""What a team deploys, checked statically (containers cannot run here; the topology test
runs the same processes without them): the instance against Dagster's own config schema,
the compose file's services and commands, the image, the Kubernetes worker."""

import re
from pathlib import Path

import pytest
import yaml
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
ROTA_SERVICES = ["code-server", "webserver", "daemon", "worker-1", "worker-2"]


def _instance(tmp_path, text: str) -> dict:
    (tmp_path / "dagster.yaml").write_text(text)
    config, _ = dagster_instance_config(str(tmp_path))
    return config


def test_the_production_instance_is_valid_dagster_config_with_every_guard(tmp_path):
    config = _instance(tmp_path, (DEPLOY / "dagster.yaml").read_text())
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert {"key": "dagster/backfill", "limit": 3} in config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert config["concurrency"]["pools"] == {"default_limit": 1, "granularity": "run"}
    assert config["run_monitoring"]["enabled"] and config["run_retries"]["enabled"]
    assert config["retention"]["schedule"]["purge_after_days"] > 0
    assert config["run_launcher"]["class"] == "DockerRunLauncher"
    storage = dict(config["storage"]["postgres"]["postgres_db"])
    assert storage.pop("scheme") == "postgresql+psycopg2"
    assert all(set(value) == {"env"} for value in storage.values())  # every credential from the environment
    with pytest.raises(DagsterInvalidConfigError):  # the check has teeth
        _instance(tmp_path, (DEPLOY / "dagster.yaml").read_text().replace("max_concurrent_runs: 10",
                                                                          "max_concurrent_runs: ten"))


def test_the_compose_file_runs_the_topology_migrating_first():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", *ROTA_SERVICES}
    assert services["migrate"]["command"] == ["rota", "migrate"]
    for name in ROTA_SERVICES:
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert services[name]["image"] == services["migrate"]["image"], name
        assert services[name]["environment"]["ROTA_DATABASE_URL"].endswith("@postgres:5432/rota"), name
    code_server = services["code-server"]["command"]
    assert code_server[:3] == ["dagster", "code-server", "start"]
    assert code_server[code_server.index("-m") + 1] == "pipelines.definitions"
    assert services["code-server"]["environment"]["DAGSTER_CURRENT_IMAGE"] == services["migrate"]["image"]
    assert services["webserver"]["command"][0] == "dagster-webserver"
    assert services["daemon"]["command"][:2] == ["dagster-daemon", "run"]
    assert [services[w]["command"] for w in ("worker-1", "worker-2")] == [["rota", "worker"]] * 2
    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())["load_from"][0]["grpc_server"]
    assert (workspace["host"], str(workspace["port"])) == ("code-server", code_server[code_server.index("-p") + 1])
    for name in ("webserver", "daemon"):
        assert "/var/run/docker.sock:/var/run/docker.sock" in services[name]["volumes"]  # DockerRunLauncher
        assert any(v.startswith("./workspace.yaml:") for v in services[name]["volumes"])
    # The instance reads DAGSTER_PG_*; every rota service gives them.
    needed = set(re.findall(r"env: (DAGSTER_PG_\w+)", (DEPLOY / "dagster.yaml").read_text()))
    assert needed and all(needed <= set(services[name]["environment"]) for name in ROTA_SERVICES)
    init = (DEPLOY / "postgres-init.sql").read_text()
    assert "BYPASSRLS" in init and "CREATEDB" not in init and "CREATEROLE" not in init


def test_the_image_installs_the_package_and_serves_the_code_location():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"pip install --no-cache-dir \. ", dockerfile)  # a package, not editable
    assert "-e ." not in dockerfile
    assert "COPY sql sql" in dockerfile
    assert re.search(r'CMD \["dagster", "code-server", "start".*"pipelines.definitions"', dockerfile.replace("\\\n", ""))
    assert "COPY deploy/dagster.yaml" in dockerfile


def test_the_kubernetes_workers_and_the_helm_values():
    deployment = yaml.safe_load((DEPLOY / "k8s" / "worker.yaml").read_text())
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["rota", "worker"]
    assert pod["terminationGracePeriodSeconds"] > float(command[command.index("--grace") + 1])
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is False
    [code] = values["dagster-user-deployments"]["deployments"]
    assert code["codeServerArgs"][:2] == ["-m", "pipelines.definitions"]
    assert values["dagsterDaemon"]["runMonitoring"]["enabled"] and values["dagsterDaemon"]["runRetries"]["enabled"]
