"""A real Prometheus on loopback that scrapes dra-gpu's processes as the chart's monitors would.

``Prometheus`` runs the ``prometheus`` binary (Debian's package, unpacked by
``hack/build-prometheus.sh``) with a scrape config whose targets are written to a file
(``file_sd``), so tests add and remove agents and controllers while it runs. ``ScrapeTarget``
builds a target with the labels the chart's ServiceMonitor (controller) and PodMonitor (agents)
give their series under the Prometheus Operator — ``job``, ``namespace``, ``pod``,
``container``, ``endpoint`` (and ``service`` for the controller) — so the chart's alert rules
and dashboard queries select them here as they would in a cluster.

The processes scraped are the host-side ``AgentProcess`` and ``ControllerProcess`` (same flags,
ports and paths as the chart's pods): pods of a real node run in its network namespace, which a
Prometheus on the host cannot reach.

It owns its process and its files under ``state_dir``; it never touches what it scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_gpu.testing._agent import AgentProcess, ControllerProcess
from dra_gpu.testing._control_plane import _tail, dying_with_parent, free_port
from dra_gpu.testing._lifecycle import StartStop

Sample = dict[str, Any]
"""One element of a PromQL instant vector: ``{"metric": {label: value}, "value": [t, "v"]}``."""


class PrometheusError(RuntimeError):
    """Prometheus answered a query or an API call with an error (the message is its own)."""


@dataclasses.dataclass(frozen=True)
class ScrapeTarget:
    """One ``/metrics`` endpoint and the target labels Prometheus attaches to its series."""

    address: str
    """``host:port`` of the metrics listener."""
    labels: dict[str, str]
    """Target labels; ``job`` among them."""

    @classmethod
    def controller(
        cls, process: ControllerProcess, release: str = "dra-gpu", namespace: str = "dra-gpu"
    ) -> ScrapeTarget:
        """A controller replica as the chart's ServiceMonitor selects it: through the
        ``<fullname>-controller-metrics`` Service, whose name becomes the job."""
        service = f"{_fullname(release)}-controller-metrics"
        return cls(
            f"127.0.0.1:{process.metrics_port}",
            {
                "job": service,
                "namespace": namespace,
                "service": service,
                "endpoint": "metrics",
                "pod": process.identity,
                "container": "controller",
            },
        )

    @classmethod
    def agent(
        cls, process: AgentProcess, release: str = "dra-gpu", namespace: str = "dra-gpu"
    ) -> ScrapeTarget:
        """An agent as the chart's PodMonitor selects it: job ``<namespace>/<fullname>-agent``,
        one pod per node."""
        fullname = _fullname(release)
        return cls(
            f"127.0.0.1:{process.metrics_port}",
            {
                "job": f"{namespace}/{fullname}-agent",
                "namespace": namespace,
                "endpoint": "metrics",
                "pod": f"{fullname}-agent-{process.node}",
                "container": "agent",
            },
        )


def _fullname(release: str) -> str:
    """The chart's ``dra-gpu.fullname`` without overrides."""
    return release if "dra-gpu" in release else f"{release}-dra-gpu"


@dataclasses.dataclass
class Prometheus(StartStop):
    """A Prometheus server on 127.0.0.1; ``start()``/``astart()`` return once it is ready.

    ``bin_dir`` holds ``prometheus`` and ``promtool``. Scrapes and rule evaluations run every
    ``interval`` seconds (1 s: tests wait for conditions, and a short interval makes them come
    soon). ``rule_files`` are loaded as given (Prometheus rule-group files)."""

    state_dir: Path
    bin_dir: Path
    port: int = 0
    interval: float = 1.0
    rule_files: Sequence[Path] = ()
    _popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "prometheus.log"

    @property
    def targets_file(self) -> Path:
        return self.state_dir / "targets.json"

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run hack/build-prometheus.sh")
        return path

    def config(self) -> dict[str, Any]:
        seconds = f"{self.interval:g}s"
        return {
            "global": {"scrape_interval": seconds, "evaluation_interval": seconds},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "dra-gpu",
                    "metrics_path": "/metrics",
                    "scrape_timeout": seconds,
                    # The job label comes from each target, as the Operator's monitors set it.
                    "honor_labels": False,
                    "file_sd_configs": [
                        {"files": [str(self.targets_file)], "refresh_interval": seconds}
                    ],
                }
            ],
        }

    def set_targets(self, targets: Iterable[ScrapeTarget]) -> None:
        """What to scrape from now on (written atomically; read within ``interval``)."""
        groups = [{"targets": [t.address], "labels": t.labels} for t in targets]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.targets_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(groups, indent=1))
        os.replace(temporary, self.targets_file)

    def start(self, timeout: float = 60.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not self.targets_file.exists():
            self.set_targets(())
        config_file = self.state_dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        if not self.port:
            self.port = free_port()
        with self.log_file.open("ab") as log:
            self._popen = subprocess.Popen(
                dying_with_parent(
                    [
                        str(self.binary("prometheus")),
                        f"--config.file={config_file}",
                        f"--storage.tsdb.path={self.state_dir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--web.enable-lifecycle",
                        "--storage.tsdb.retention.time=1d",
                    ]
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                raise RuntimeError(f"prometheus exited; log:\n{_tail(self.log_file, 30)}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready; log:\n{_tail(self.log_file, 30)}")

    async def astart(self, ready_within: float = 60.0) -> None:
        await asyncio.to_thread(self.start, ready_within)

    def stop(self, timeout: float = 20.0) -> None:
        if self._popen is None or self._popen.poll() is not None:
            return
        self._popen.send_signal(signal.SIGTERM)
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``; its ``data``, or ``PrometheusError`` with its message."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, promql: str) -> list[Sample]:
        """An instant query; the samples of its vector (a scalar becomes one sample)."""
        data = self.api("query", query=promql)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[Sample] = data["result"]
        return result

    def values(self, promql: str, by: str) -> dict[str, float]:
        """The query's values keyed by one label (``by``)."""
        return {s["metric"].get(by, ""): float(s["value"][1]) for s in self.query(promql)}

    def value(self, promql: str) -> float | None:
        """The value of a query that answers one sample; None when it answers none."""
        samples = self.query(promql)
        if not samples:
            return None
        if len(samples) > 1:
            raise PrometheusError(f"{promql} answered {len(samples)} samples: {samples}")
        return float(samples[0]["value"][1])

    def targets_up(self) -> bool:
        """Every target scraped at least once, and the last scrape succeeded."""
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now, as ``/api/v1/alerts`` lists them."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups

    def promtool(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``promtool`` with these arguments (not checked: read ``returncode``)."""
        return subprocess.run(
            [str(self.binary("promtool")), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def check_metrics(self, page: str) -> str:
        """``promtool check metrics`` of a ``/metrics`` page: its complaints ("" when clean)."""
        done = self.promtool("check", "metrics", stdin=page)
        return "" if done.returncode == 0 else (done.stdout + done.stderr).strip()
