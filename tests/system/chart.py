"""The instance config the official Dagster chart (dagster/dagster 1.13.x) writes into its
`<release>-instance` ConfigMap from a values file, rendered in Python as the chart's
templates render it: templates/configmap-instance.yaml and templates/helpers/instance/
(_postgresql.tpl, _run-launcher.tpl, _run-coordinator.tpl, _concurrency.tpl). No `helm`
binary or chart archive can be fetched here; each value the chart takes from its own
defaults when rota's values leave it unset is named in CHART_DEFAULTS."""

import copy

CHART_DEFAULTS = {
    "scheduler": {"type": "DagsterDaemonScheduler"},
    "computeLogManager": {"type": "NoOpComputeLogManager"},
    "pythonLogs": {},
    "runLauncher": {"config": {"k8sRunLauncher": {"loadInclusterConfig": True, "imagePullPolicy": "Always",
                                                  "envConfigMaps": [], "envSecrets": [], "envVars": [],
                                                  "volumeMounts": [], "volumes": []}}},
    "dagsterDaemon": {"enabled": True,
                      "runCoordinator": {"enabled": True, "type": "QueuedRunCoordinator",
                                         "config": {"queuedRunCoordinator": {}}},
                      "runMonitoring": {"enabled": True, "startTimeoutSeconds": 300, "pollIntervalSeconds": 120,
                                        "freeSlotsAfterRunEndSeconds": 0},
                      "runRetries": {"enabled": True, "maxRetries": 0},
                      "sensors": {"useThreads": True, "numWorkers": 4},
                      "schedules": {"useThreads": True, "numWorkers": 4}},
    "concurrency": {"enabled": False, "pools": {}, "runs": {"tagConcurrencyLimits": []}},
    "retention": {"enabled": False},
    "telemetry": {"enabled": True},
    "serviceAccount": {"name": "dagster"},
    "namespace": "default",
}


class ChartRefused(ValueError):
    """What the chart's own `fail` calls refuse to render."""


def merged(defaults: dict, values: dict) -> dict:
    """Helm's merge of a chart's defaults with a values file: maps merge key by key, any
    other value replaces the default."""
    result = copy.deepcopy(defaults)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def chart_storage(values: dict) -> dict:
    """dagsterYaml.postgresql.config: the storages' connection."""
    postgresql = values["postgresql"]
    db = {
        "username": postgresql["postgresqlUsername"],
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": postgresql["postgresqlHost"],
        "db_name": postgresql["postgresqlDatabase"],
        "port": postgresql["service"]["port"],
        "params": postgresql.get("postgresqlParams") or {},
    }
    if postgresql.get("postgresqlScheme"):
        db["scheme"] = postgresql["postgresqlScheme"]
    return {"postgres_db": db}


def _run_launcher(values: dict) -> dict:
    kind = values["runLauncher"]["type"]
    if kind != "K8sRunLauncher":
        raise NotImplementedError(f"only K8sRunLauncher is rendered here, not {kind}")
    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    config = {"load_incluster_config": k8s["loadInclusterConfig"],
              "job_namespace": k8s.get("jobNamespace") or values["namespace"],
              "image_pull_policy": k8s["imagePullPolicy"],
              "service_account_name": values["serviceAccount"]["name"],
              "dagster_home": {"env": "DAGSTER_HOME"},
              "instance_config_map": {"env": "DAGSTER_K8S_INSTANCE_CONFIG_MAP"},
              "postgres_password_secret": {"env": "DAGSTER_K8S_PG_PASSWORD_SECRET"},
              "env_config_maps": [{"env": "DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP"},
                                  *[m["name"] for m in k8s["envConfigMaps"] if "name" in m]]}
    if k8s["envSecrets"]:
        config["env_secrets"] = [s["name"] for s in k8s["envSecrets"] if "name" in s]
    for key, name in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes")):
        if k8s[key]:
            config[name] = k8s[key]
    return {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": config}


def _run_coordinator(values: dict) -> dict:
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"] or {}
    coordinator = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}
    config = {}
    for key, name in (("maxConcurrentRuns", "max_concurrent_runs"), ("tagConcurrencyLimits", "tag_concurrency_limits"),
                      ("dequeueIntervalSeconds", "dequeue_interval_seconds")):
        if queued.get(key):
            config[name] = queued[key]
    if config:
        coordinator["config"] = config
    return coordinator


def _concurrency(values: dict) -> dict:
    pools, runs = values["concurrency"]["pools"], values["concurrency"]["runs"]
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    if coordinator["enabled"] and coordinator["type"] == "QueuedRunCoordinator":
        queued = coordinator["config"]["queuedRunCoordinator"] or {}
        if runs.get("maxConcurrentRuns") is not None and queued.get("maxConcurrentRuns") is not None:
            raise ChartRefused("Cannot set both concurrency.runs.maxConcurrentRuns and "
                               "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.maxConcurrentRuns")
        if runs.get("tagConcurrencyLimits") and queued.get("tagConcurrencyLimits"):
            raise ChartRefused("Cannot set both concurrency.runs.tagConcurrencyLimits and "
                               "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.tagConcurrencyLimits")
    rendered = {}
    pool_fields = {name: pools[key] for key, name in (("defaultLimit", "default_limit"), ("granularity", "granularity"),
                                                      ("opGranularityRunBuffer", "op_granularity_run_buffer"))
                   if pools.get(key) is not None}
    if pool_fields:
        rendered["pools"] = pool_fields
    run_fields = {}
    if runs.get("maxConcurrentRuns") is not None:
        run_fields["max_concurrent_runs"] = runs["maxConcurrentRuns"]
    if runs.get("tagConcurrencyLimits"):
        run_fields["tag_concurrency_limits"] = [
            {"key": limit["key"], **({"value": limit["value"]} if limit.get("value") else {}), "limit": limit["limit"]}
            for limit in runs["tagConcurrencyLimits"]]
    if run_fields:
        rendered["runs"] = run_fields
    return rendered


def chart_instance(rota_values: dict) -> dict:
    """The instance's dagster.yaml, as a dict, that the chart renders from `rota_values`."""
    values = merged(CHART_DEFAULTS, rota_values)
    storage = chart_storage(values)
    daemon = values["dagsterDaemon"]
    instance = {
        "scheduler": {"module": "dagster._core.scheduler", "class": "DagsterDaemonScheduler"},
        "schedule_storage": {"module": "dagster_postgres.schedule_storage", "class": "PostgresScheduleStorage",
                             "config": storage},
        "run_launcher": _run_launcher(values),
        "run_storage": {"module": "dagster_postgres.run_storage", "class": "PostgresRunStorage", "config": storage},
        "event_log_storage": {"module": "dagster_postgres.event_log", "class": "PostgresEventLogStorage",
                              "config": storage},
        "compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager",
                         "class": "NoOpComputeLogManager"},
        "telemetry": {"enabled": values["telemetry"]["enabled"]},
    }
    if daemon["enabled"] and daemon["runCoordinator"]["enabled"]:
        instance["run_coordinator"] = _run_coordinator(values)
    monitoring = daemon["runMonitoring"]
    if daemon["enabled"] and monitoring["enabled"]:
        instance["run_monitoring"] = {
            "enabled": True, "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            **({"cancel_timeout_seconds": monitoring["cancelTimeoutSeconds"]}
               if monitoring.get("cancelTimeoutSeconds") is not None else {}),
            **({"max_resume_run_attempts": monitoring["maxResumeRunAttempts"]}
               if monitoring.get("maxResumeRunAttempts") is not None else {}),
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
            "free_slots_after_run_end_seconds": monitoring["freeSlotsAfterRunEndSeconds"]}
    retries = daemon["runRetries"]
    if daemon["enabled"] and retries["enabled"]:
        instance["run_retries"] = {"enabled": True, **({"max_retries": retries["maxRetries"]}
                                                      if retries.get("maxRetries") else {})}
    for kind in ("sensors", "schedules"):
        threads = daemon[kind]
        if daemon["enabled"] and threads.get("useThreads"):
            instance[kind] = {"use_threads": True, **({"num_workers": threads["numWorkers"]}
                                                      if threads.get("numWorkers") else {})}
    retention = values["retention"]
    if retention["enabled"]:
        instance["retention"] = {kind: {"purge_after_days": retention[key]["purgeAfterDays"]}
                                 for key, kind in (("sensor", "sensor"), ("schedule", "schedule"),
                                                   ("autoMaterialize", "auto_materialize")) if retention.get(key)}
    if values["concurrency"]["enabled"]:
        instance["concurrency"] = _concurrency(values)
    instance.update(copy.deepcopy(values.get("additionalInstanceConfig") or {}))
    return instance
