"""deploy/docker-compose.yml brought up with `docker run`, one container per service, as
Compose would: Debian has no Compose v2, and its Compose v1 refuses the file's top-level
`name`. It reads the file and does what the file asks for, no more: the project's
network and volumes, each service's image, command, environment (with `${VAR:?message}`
taken from the environment), volumes (paths relative to the file), ports, group_add,
restart policy, stop grace period and healthcheck, started in `depends_on` order, waiting
for `service_healthy` and `service_completed_successfully`."""

import os
import re
import subprocess
import time
from pathlib import Path

import yaml

_VARIABLE = re.compile(r"\$\{(\w+)(?::\?([^}]*))?\}")


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def _interpolate(value: str, environ: dict) -> str:
    def replace(match: re.Match) -> str:
        name, message = match.group(1), match.group(2)
        if name not in environ:
            raise KeyError(f"{name}: {message or 'not set'}")
        return environ[name]

    return _VARIABLE.sub(replace, value)


class Project:
    def __init__(self, compose_file: Path, environ: dict | None = None, images: dict | None = None,
                 extra_env: dict | None = None):
        self.file = compose_file
        self.spec = yaml.safe_load(compose_file.read_text())
        self.name = self.spec["name"]
        self.environ = {**os.environ, **(environ or {})}
        self.images = images or {}
        self.extra_env = extra_env or {}

    def container(self, service: str) -> str:
        return f"{self.name}-{service}"

    def _network(self, key: str) -> str:
        return (self.spec.get("networks", {}).get(key) or {}).get("name", f"{self.name}_{key}")

    def _volume(self, source: str) -> str:
        if source.startswith((".", "/")):
            return str((self.file.parent / source).resolve()) if source.startswith(".") else source
        return f"{self.name}_{source}"

    def _order(self) -> list[str]:
        services, ordered = self.spec["services"], []

        def visit(name: str) -> None:
            if name not in ordered:
                for dependency in services[name].get("depends_on", {}):
                    visit(dependency)
                ordered.append(name)

        for name in services:
            visit(name)
        return ordered

    def _run_args(self, name: str, service: dict) -> list[str]:
        args = ["run", "-d", "--name", self.container(name), "--hostname", name]
        for network in service.get("networks", []):
            args += ["--network", self._network(network), "--network-alias", name]
        environment = {**service.get("environment", {}), **self.extra_env.get(name, {})}
        for key, value in environment.items():
            args += ["-e", f"{key}={_interpolate(str(value), self.environ)}"]
        for volume in service.get("volumes", []):
            source, rest = volume.split(":", 1)
            args += ["-v", f"{self._volume(source)}:{rest}"]
        for port in service.get("ports", []):
            args += ["-p", port]
        for group in service.get("group_add", []):
            args += ["--group-add", _interpolate(str(group), self.environ)]
        if "restart" in service:
            args += ["--restart", service["restart"]]
        if "stop_grace_period" in service:
            args += ["--stop-timeout", str(int(service["stop_grace_period"].rstrip("s")))]
        health = service.get("healthcheck")
        if health:
            test = health["test"]
            command = " ".join(test[1:]) if test[0] in ("CMD", "CMD-SHELL") else test
            args += ["--health-cmd", command, "--health-interval", health.get("interval", "30s"),
                     "--health-retries", str(health.get("retries", 3))]
        return args + [self.images.get(name, service["image"]), *service.get("command", [])]

    def _wait(self, name: str, condition: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} "
                           "{{if .State.Health}}{{.State.Health.Status}}{{end}}", self.container(name)).stdout.split()
            if condition == "service_healthy" and state[2:] == ["healthy"]:
                return
            if condition == "service_completed_successfully" and state[0] == "exited":
                if state[1] != "0":
                    raise RuntimeError(f"{name} exited with {state[1]}:\n{self.logs(name)}")
                return
            if condition == "service_started" and state[0] == "running":
                return
            time.sleep(1)
        raise TimeoutError(f"{name} did not reach {condition} in {timeout} s:\n{self.logs(name)}")

    def up(self) -> None:
        for key in self.spec.get("networks", {}):
            docker("network", "create", self._network(key))
        for key in self.spec.get("volumes", {}):
            docker("volume", "create", self._volume(key))
        for name in self._order():
            service = self.spec["services"][name]
            for dependency, rule in service.get("depends_on", {}).items():
                self._wait(dependency, rule.get("condition", "service_started"))
            docker(*self._run_args(name, service))

    def logs(self, name: str) -> str:
        done = docker("logs", "--tail", "200", self.container(name), check=False)
        return done.stdout + done.stderr

    def down(self) -> None:
        for name in reversed(self._order()):
            docker("rm", "-f", "-v", self.container(name), check=False)
        for key in self.spec.get("volumes", {}):
            docker("volume", "rm", "-f", self._volume(key), check=False)
        for key in self.spec.get("networks", {}):
            docker("network", "rm", self._network(key), check=False)
