"""What a team deploys, checked statically (containers cannot run here; the topology test
runs the same processes without them): the instance against Dagster's own config schema,
the compose file's services and commands, the image, the Kubernetes worker."""

import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config

from tests.system.chart import ChartRefused, chart_instance, chart_storage

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
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
    assert storage.pop("params") == {"options": "-c TimeZone=UTC"}
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
    assert code_server[code_server.index("-m") + 1] == "rota.pipelines.definitions"
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
    assert re.search(r"pip install --no-cache-dir .*--find-links /wheels \. ", dockerfile)  # a package, not editable
    assert "-e ." not in dockerfile
    assert "COPY sql sql" in dockerfile
    assert re.search(r'CMD \["dagster", "code-server", "start".*"rota.pipelines.definitions"', dockerfile.replace("\\\n", ""))
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
    assert code["codeServerArgs"][:2] == ["-m", "rota.pipelines.definitions"]
    assert values["dagsterDaemon"]["runMonitoring"]["enabled"] and values["dagsterDaemon"]["runRetries"]["enabled"]


def test_the_helm_charts_instance_is_one_dagster_loads_with_deploys_limits(tmp_path):
    """The whole instance the chart renders from values.yaml, loaded by Dagster: the limits
    are deploy/dagster.yaml's, in the chart's concurrency block alone."""
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    config = _instance(tmp_path, yaml.safe_dump(chart_instance(values)))
    deployed = _instance(tmp_path, (DEPLOY / "dagster.yaml").read_text())
    assert config["concurrency"] == deployed["concurrency"]
    assert config["run_coordinator"] == {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    assert config["run_launcher"]["config"]["env_secrets"] == ["rota-database"]
    for storage in ("run_storage", "event_log_storage", "schedule_storage"):
        db = config[storage]["config"]["postgres_db"]
        assert db["scheme"] == "postgresql+psycopg2" and db["params"] == {"options": "-c TimeZone=UTC"}
    for section in ("run_monitoring", "retention"):
        assert {k: v for k, v in config[section].items() if k in deployed[section]} == \
            {k: v for k, v in deployed[section].items() if k in config[section]}, section
    assert config["run_retries"]["max_retries"] == deployed["run_retries"]["max_retries"]
    assert config["telemetry"] == {"enabled": False}


def test_the_limits_in_two_places_are_refused_by_the_chart_or_by_dagster(tmp_path):
    """The shape values.yaml had before issue 35: limits in the run coordinator's config and
    pools in additionalInstanceConfig. Dagster refuses the instance it renders (every
    webserver, daemon and run worker would fail at start); limits in both places the chart
    itself refuses."""
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    concurrency = values.pop("concurrency")
    values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"] = concurrency["runs"]
    values["additionalInstanceConfig"] = {"concurrency": {"pools": {"default_limit": 1, "granularity": "run"}}}
    with pytest.raises(DagsterInvalidConfigError, match="incompatible with the `concurrency > runs` config"):
        _instance(tmp_path, yaml.safe_dump(chart_instance(values)))
    values.pop("additionalInstanceConfig")
    values["concurrency"] = concurrency
    with pytest.raises(ChartRefused, match="Cannot set both concurrency.runs.maxConcurrentRuns"):
        chart_instance(values)


def test_the_helm_charts_instance_stores_run_events(tmp_path, test_server, monkeypatch):
    """The chart's instance, rendered from values.yaml, pointed at a real database and used
    by Dagster for a run: its event writes (NOTIFY run_events) must go through."""
    from dagster import DagsterInstance, asset, materialize
    from sqlalchemy import make_url

    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    storage = {"postgres": chart_storage(values)}
    name = f"rota_chart_{os.getpid()}"
    test_server.create(name)
    try:
        server = make_url(test_server.url(name))
        query = dict(server.query)
        storage["postgres"]["postgres_db"].update(
            username=server.username, hostname=server.host or "", port=server.port or 5432, db_name=name,
            params={"host": query["host"]} if "host" in query else {})
        monkeypatch.setenv("DAGSTER_PG_PASSWORD", server.password or "unused")
        (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"storage": storage}))

        @asset
        def probe() -> None:
            return None

        with DagsterInstance.from_config(str(tmp_path)) as instance:
            assert materialize([probe], instance=instance).success
            assert instance.get_latest_materialization_event(probe.key) is not None
    finally:
        test_server.drop(name)


def test_every_variable_the_run_launcher_forwards_is_set_where_runs_are_launched():
    launcher = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["run_launcher"]["config"]["env_vars"]
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    for name in ("daemon", "webserver"):  # the daemon launches queued runs; the webserver terminates them
        missing = set(launcher) - set(services[name]["environment"])
        assert not missing, f"{name} lacks {missing}"


def test_the_services_that_use_the_docker_socket_may_open_it():
    """The image runs as uid 10001; the socket is root:docker 0660."""
    assert "useradd --create-home --uid 10001 rota" in (DEPLOY / "Dockerfile").read_text()
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    using = [name for name, service in services.items()
             if any(v.startswith("/var/run/docker.sock:") for v in service.get("volumes", []))]
    assert using == ["webserver", "daemon"]
    for name in using:
        assert [g for g in services[name].get("group_add", []) if g.startswith("${DOCKER_GID")], name


def _copied(dockerfile: str) -> list[str]:
    return [source for line in dockerfile.splitlines() if line.startswith("COPY ")
            for source in line.split()[1:-1]]


def test_the_build_context_sends_what_the_image_copies_and_no_local_state():
    import fnmatch

    ignored = [line.strip() for line in (DEPLOY.parent / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]

    def excluded(path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern.removeprefix("**/")) or fnmatch.fnmatch(path, pattern)
                   or path.split("/")[0] == pattern for pattern in ignored)

    for local_state in (".venv", ".rota", ".git", "pipelines/__pycache__", "rota.egg-info"):
        assert excluded(local_state), local_state
    for source in _copied((DEPLOY / "Dockerfile").read_text()):
        assert not excluded(source), source


def test_the_images_pip_step_resolves_from_what_it_copies(tmp_path):
    """The Dockerfile's `pip install` run in a clean virtualenv (resolved, not installed) in
    a directory holding only what the Dockerfile copies before it."""
    import shutil
    import subprocess
    import venv

    dockerfile = (DEPLOY / "Dockerfile").read_text()
    context = tmp_path / "src"
    context.mkdir()
    for source in _copied(dockerfile.split("RUN python3 -m venv")[0]):
        origin = DEPLOY.parent / source
        (shutil.copytree if origin.is_dir() else shutil.copy)(origin, context / source)
    pip_step = re.search(r"&& pip install --no-cache-dir (.+?) \\\n", dockerfile).group(1).split()
    # The image's wheels directory is the build context's deploy/wheels; the index stays on.
    pip_step = [str(context / "deploy" / "wheels") if arg == "/wheels" else arg
                for arg in pip_step if arg != "${OFFLINE:+--no-index}"]
    venv.create(tmp_path / "venv", with_pip=True)
    done = subprocess.run([str(tmp_path / "venv" / "bin" / "pip"), "install", "--dry-run", "--quiet", *pip_step],
                          cwd=context, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_kubernetes_migrates_first_and_workers_poll_behind_a_pooler():
    job = yaml.safe_load((DEPLOY / "k8s" / "migrate.yaml").read_text())
    worker = yaml.safe_load((DEPLOY / "k8s" / "worker.yaml").read_text())
    assert job["kind"] == "Job"
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    [work] = worker["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["rota", "migrate"]
    assert (migrate["image"], migrate["envFrom"]) == (work["image"], work["envFrom"])
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert "--no-listen" in work["command"]


def _schema_faults(value, model: str, where: str) -> list[str]:
    """Every field of `value` that the Kubernetes API's model `model` (as the official client
    describes it: field names, nesting, list and map types) has no place for, and every
    required field it lacks."""
    import kubernetes.client as k8s

    if model.startswith("list["):
        inner = model[5:-1]
        if not isinstance(value, list):
            return [f"{where}: a list of {inner} expected, not {type(value).__name__}"]
        return [fault for n, item in enumerate(value) for fault in _schema_faults(item, inner, f"{where}[{n}]")]
    if model.startswith("dict("):
        inner = model[model.index(",") + 1:-1].strip()
        if not isinstance(value, dict):
            return [f"{where}: a map expected"]
        return [fault for key, item in value.items() for fault in _schema_faults(item, inner, f"{where}.{key}")]
    cls = getattr(k8s, model, None)
    if cls is None:  # a primitive (str, int, bool, object)
        primitive = {"str": str, "int": int, "bool": bool, "float": (int, float)}.get(model)
        if primitive and not isinstance(value, primitive):
            return [f"{where}: {model} expected, not {value!r}"]
        return []
    if not isinstance(value, dict):
        return [f"{where}: a {model} object expected"]
    fields = {json: (python, cls.openapi_types[python]) for python, json in cls.attribute_map.items()}
    faults = [f"{where}.{key}: no such field of {model}" for key in value if key not in fields]
    for key, item in value.items():
        if key in fields:
            faults += _schema_faults(item, fields[key][1], f"{where}.{key}")
    faults += [f"{where}: {model} lacks {cls.attribute_map[name]}" for name in _required(cls)
               if cls.attribute_map[name] not in value]
    return faults


def _required(cls) -> list[str]:
    """The model's required fields: those whose setter, validating as the client does,
    refuses None."""
    import kubernetes.client as k8s

    probe = cls.__new__(cls)
    probe.local_vars_configuration = k8s.Configuration()
    required = []
    for name in cls.openapi_types:
        try:
            setattr(probe, name, None)
        except ValueError:
            required.append(name)
    return required


@pytest.mark.parametrize("manifest", sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml")))
def test_the_kubernetes_manifests_fit_the_apis_schema(manifest):
    """kubectl's dry run needs an API server for its schemas and none runs here, so the
    manifests are held against the official client's models of the same API (every field
    named, nested and typed as the API has it)."""
    kinds = {("batch/v1", "Job"): "V1Job", ("apps/v1", "Deployment"): "V1Deployment"}
    for document in yaml.safe_load_all((DEPLOY / "k8s" / manifest).read_text()):
        model = kinds[(document["apiVersion"], document["kind"])]
        assert _schema_faults(document, model, manifest) == []


def test_the_schema_check_has_teeth():
    worker = yaml.safe_load((DEPLOY / "k8s" / "worker.yaml").read_text())
    worker["spec"]["template"]["spec"]["containers"][0]["envfrom"] = []  # a misspelt field
    worker["spec"]["replicas"] = "two"
    del worker["spec"]["template"]["spec"]["containers"][0]["name"]
    faults = _schema_faults(worker, "V1Deployment", "worker.yaml")
    assert any("envfrom: no such field" in f for f in faults)
    assert any("replicas: int expected" in f for f in faults)
    assert any("lacks name" in f for f in faults)


def _storage_in(config_text: str) -> dict:
    return yaml.safe_load(config_text)["storage"]


@pytest.mark.parametrize("shipped", ["deploy/dagster.yaml", "helm values.yaml", "rota dev"])
def test_dagsters_own_storage_keeps_utc_whatever_the_servers_zone(tmp_path, test_server, monkeypatch, shipped):
    """Dagster writes naive timestamps with CURRENT_TIMESTAMP (runs.create_timestamp) and
    reads them as UTC: in a database whose TimeZone is Pacific/Chatham they would be 13¾
    hours off, unless the storage's connections set their own zone."""
    from dagster import DagsterInstance, asset, materialize
    from psycopg import sql
    from sqlalchemy import make_url

    from rota.resources.database.server import driver_url

    name = f"rota_storage_zone_{os.getpid()}"
    test_server.create(name)
    try:
        with test_server._connect() as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} SET timezone TO 'Pacific/Chatham'").format(sql.Identifier(name)))
        monkeypatch.delenv("PGTZ", raising=False)  # the server's zone is the one under test
        server = make_url(test_server.url(name))
        if shipped == "rota dev":
            from rota.pipelines.cli.dev import DAGSTER_YAML, dagster_storage_url

            storage = _storage_in(DAGSTER_YAML)
            monkeypatch.setenv("ROTA_DAGSTER_STORAGE_URL", dagster_storage_url(test_server.url(name)))
        else:
            if shipped == "deploy/dagster.yaml":
                storage = _storage_in((DEPLOY / "dagster.yaml").read_text())
            else:
                storage = {"postgres": chart_storage(yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text()))}
            db = storage["postgres"]["postgres_db"]
            query = dict(server.query)
            db.update(username=server.username, password=server.password or "unused", hostname=server.host or "",
                      port=server.port or 5432, db_name=name,
                      params={**(db.get("params") or {}), **({"host": query["host"]} if "host" in query else {})})
        (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"storage": storage}))

        @asset
        def probe() -> None:
            return None

        with DagsterInstance.from_config(str(tmp_path)) as instance:
            started = datetime.now(timezone.utc).replace(tzinfo=None)
            assert materialize([probe], instance=instance).success
        with create_engine(driver_url(test_server.url(name))).connect() as conn:
            created = conn.exec_driver_sql("SELECT create_timestamp FROM runs").scalar_one()
        assert abs(created - started) < timedelta(minutes=5), f"{shipped}: a run created at {started} UTC " \
                                                              f"is stored as {created}"
    finally:
        test_server.drop(name)
