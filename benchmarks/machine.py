"""What the figures were measured on: the machine, the runtimes and the SDK versions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata

from devtools.paths import ROOT

PACKAGES = ("azure-core", "azure-data-tables", "azure-storage-queue", "azure-servicebus", "azure-functions")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _azurite_version() -> str:
    try:
        return json.loads((ROOT / "node_modules" / "azurite" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return "not installed"


def _node_version() -> str:
    try:
        return subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe() -> dict[str, str]:
    """Machine and versions, as display strings (no paths of this machine)."""
    memory = _memory_gib()
    info = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or "unknown"),
        "memory": f"{memory} GiB" if memory is not None else "unknown",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "node": _node_version(),
        "azurite": _azurite_version(),
    }
    for package in PACKAGES:
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = "not installed"
    return info
