"""docker/compose.yaml, exercised: the same services, commands and environment
started as local processes, one 127.0.0.x address per service."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flightpart.local.cluster import Daemon

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker" / "compose.yaml"


def start_order(services: dict) -> list[str]:
    done: list[str] = []
    while len(done) < len(services):
        for name, svc in services.items():
            deps = svc.get("depends_on", {})
            if name not in done and all(d in done for d in deps):
                done.append(name)
    return done


class LocalCompose:
    """Runs compose services as processes: hosts become 127.0.0.x, volumes temp dirs."""

    def __init__(self, spec: dict, root: Path, first_ip: int = 70):
        self.spec = spec
        self.services = spec["services"]
        self.ips: dict[str, str] = {}
        for k, name in enumerate(start_order(self.services)):
            mode = self.services[name].get("network_mode", "")
            self.ips[name] = (self.ips[mode.split(":", 1)[1]] if mode.startswith("service:")
                              else f"127.0.0.{first_ip + k}")
        self.volumes = {v: root / v for v in spec.get("volumes", {})}
        for path in self.volumes.values():
            path.mkdir(parents=True)
        self.daemons: dict[str, Daemon] = {}

    def localize(self, service: str, value: str, *, host_position: bool = False) -> str:
        """Host names become their service's address: as ``name:port``, or a whole host value."""
        if host_position and value in self.ips:
            return self.ips[value]
        value = value.replace("0.0.0.0", self.ips[service])
        for name, ip in self.ips.items():
            value = re.sub(rf"(?<![\w.-]){re.escape(name)}(?=:\d)", ip, value)
        for mount in self.services[service].get("volumes", []):
            volume, target = mount.split(":")[:2]
            if value == target or value.startswith(target + "/"):
                value = str(self.volumes[volume]) + value[len(target):]
        return value

    def argv(self, service: str, words: list[str]) -> list[str]:
        words = [self.localize(service, w, host_position=k > 0 and words[k - 1] in ("--advertise", "--host"))
                 for k, w in enumerate(words)]
        if words[0] == "flightpart":
            return [sys.executable, "-m", "flightpart", *words[1:]]
        if words[0] in ("python", "python3"):
            return [sys.executable, *words[1:]]
        return words

    def command(self, service: str) -> list[str]:
        svc = self.services[service]
        entrypoint = svc.get("entrypoint", ["flightpart"])
        return self.argv(service, list(entrypoint) + list(svc.get("command", [])))

    def env(self, service: str) -> dict[str, str]:
        return {k: self.localize(service, str(v), host_position=True)
                for k, v in self.services[service].get("environment", {}).items()}

    def healthcheck(self, service: str) -> subprocess.CompletedProcess:
        """The image's HEALTHCHECK (docker/healthcheck.py), against this service's address instead of the container's
        loopback."""
        dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
        probe = re.search(r'^HEALTHCHECK .*CMD \["python3", "(/opt/flightpart/healthcheck.py)"\]', dockerfile, re.M)
        assert probe, "the Dockerfile's HEALTHCHECK runs docker/healthcheck.py"
        url = f"http://{self.ips[service]}:8818/healthz"
        return subprocess.run([sys.executable, str(ROOT / "docker" / "healthcheck.py"), url], capture_output=True,
                              text=True, timeout=60)

    def stop(self) -> None:
        for daemon in reversed(list(self.daemons.values())):
            daemon.stop()


@pytest.fixture
def compose(tmp_path):
    spec = yaml.safe_load(COMPOSE.read_text())
    local = LocalCompose(spec, tmp_path)
    yield local
    local.stop()


def test_the_compose_cluster_runs_and_its_client_reads_from_node1(compose):
    for name in start_order(compose.services):
        svc = compose.services[name]
        if name == "client":
            continue
        argv = compose.command(name)
        assert argv[:3] == [sys.executable, "-m", "flightpart"]
        compose.daemons[name] = Daemon(argv[3:], env=compose.env(name))
        deadline = time.monotonic() + 30  # as compose does: retried until healthy (a node registers first)
        while (check := compose.healthcheck(name)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert check.returncode == 0, check.stdout + check.stderr
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond["condition"] == "service_healthy" and dep in compose.daemons
    client = subprocess.run(compose.command("client"), env={**__import__("os").environ, **compose.env("client")},
                            capture_output=True, text=True, timeout=300)
    assert client.returncode == 0, client.stderr[-3000:]
    lines = client.stdout.splitlines()
    assert lines[0].startswith("3 live nodes")
    node1 = compose.ips["node1"]
    parts = [line for line in lines if line.startswith("partition")]
    assert len(parts) == 3
    assert all(("zero-copy" in line) == (f"from {node1}:" in line) for line in parts)
    assert lines[-1] == "read equals what was put: True"


def test_the_dockerfile_runs_unprivileged_with_a_data_volume():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.\d+-slim", text, re.M) and "FROM ${BASE}" in text
    assert re.search(r"^USER (?!root)\w+", text, re.M)
    assert 'VOLUME ["/data"]' in text and "pip install -q '/src[server,ha]'" in text
    # one COPY and one RUN: under vfs (the driver that runs nested) each layer is a full copy of the image
    assert len(re.findall(r"^(COPY|ADD|RUN) ", text, re.M)) == 2
    spec = yaml.safe_load(COMPOSE.read_text())
    data_volumes = [s["volumes"][0].split(":")[0] for n, s in spec["services"].items() if n.startswith("node")]
    assert len(set(data_volumes)) == 3  # each node its own volume
