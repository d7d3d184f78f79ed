"""A cluster to plan for (``shardwise-plan --cluster FILE.yaml``): its device, hosts, GPUs per
host, memory per GPU and the bandwidth of its links, validated before anything is planned.

    device: h100            # cpu (this machine, measured), h100, h200, a100, l40s
    hosts: 8
    gpus_per_host: 8
    gpu_mem_gib: 80
    intra_host_gb_s: 360    # optional: bus bandwidth of a collective within a host, per rank
    inter_host_gb_s: 400    # optional: each host's link to the others (all its NICs), GB/s
    intra_host_latency_us: 3.4   # optional: a collective's ring step within a host, µs
    inter_host_latency_us: 9.6   # optional: a ring step across hosts, µs
    cores_per_host: 64      # optional, device cpu only: the cores a host's ranks share

The defaults are the interconnects such GPUs ship with (nccl-tests' all-reduce bus bandwidth of
8 NVLink GPUs: about 360 GB/s for NVLink 4 on H100 / H200, 230 for NVLink 3 on A100; PCIe 4
x16 for L40S, about 20) and a host link of eight 400 Gbit/s NICs (400 GB/s; A100 systems: eight
200 Gbit/s, L40S: two). On the CPU, within a host the shardwise backend copies each message
twice through shared memory (half the measured memory bandwidth), and a host link defaults to
1 Gbit/s; these are assumptions about typical parts, not measurements of a particular cluster,
and a cluster file should give its own. The latencies default to NCCL's own model of its ring
(``collective_latency.py``; on the CPU, this machine's measured step and 50 µs across hosts).
A CPU cluster's ``inter_host_gb_s`` is the link's line rate, of which TCP carries
``TCP_PAYLOAD`` (an all-reduce over emulated hosts shaped to 1 Gbit/s ran at 95.5% of it).
A CPU host's cores default to this process's (``device.host_cores``); the rates are this
machine's, measured at the threads each rank gets (``cores_per_host`` over its ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from .calibration import GPUS

DEVICES = ("cpu", *GPUS)
# GB/s: (within a host, per rank; each host's link)
DEFAULT_LINKS = {
    "h100": (360.0, 400.0),
    "h200": (360.0, 400.0),
    "a100": (230.0, 200.0),
    "l40s": (20.0, 100.0),
    "cpu": (None, 0.125),  # within: half the measured memory bandwidth
}
KEYS = (
    "device", "hosts", "gpus_per_host", "gpu_mem_gib", "intra_host_gb_s", "inter_host_gb_s",
    "intra_host_latency_us", "inter_host_latency_us", "cores_per_host",
)  # fmt: skip
OPTIONAL = KEYS[4:]
# TCP's payload in each frame a 1500-byte MTU carries: 1448 bytes (IPv4 and TCP headers with
# timestamps) of 1514 (with Ethernet's header), what a shaper or a switch port counts
TCP_PAYLOAD = 1448 / 1514


@dataclass(frozen=True)
class Cluster:
    device: str
    hosts: int
    gpus_per_host: int
    gpu_mem_gib: float
    intra_host_gb_s: float | None = None  # None: the device's default
    inter_host_gb_s: float | None = None
    intra_host_latency_us: float | None = None  # None: the device's (collective_latency.py)
    inter_host_latency_us: float | None = None
    cores_per_host: int | None = None  # CPU: the cores a host's ranks share; None: this host's

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    def intra_host_bytes_per_s(self, memory_bytes_per_s: float) -> float:
        given = self.intra_host_gb_s or DEFAULT_LINKS[self.device][0]
        return given * 1e9 if given else memory_bytes_per_s / 2

    def inter_host_bytes_per_s(self) -> float | None:
        """The payload a host's link carries per second: on the CPU (the shardwise backend's
        TCP over Ethernet) the line rate times ``TCP_PAYLOAD``; a GPU's figure as given."""
        if self.hosts == 1:
            return None
        rate = (self.inter_host_gb_s or DEFAULT_LINKS[self.device][1]) * 1e9
        return rate * TCP_PAYLOAD if self.device == "cpu" else rate


def _positive(path: str, key: str, value, kind):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok:
        what = "a whole number >= 1" if kind is int else "a number > 0"
        raise ValueError(f"{path}: {key} must be {what}, got {value!r}")
    return kind(value)


def load_cluster(path: str) -> Cluster:
    """The cluster a YAML file describes; raises ValueError naming the file, the key and the
    fix for an unreadable file, an unknown or missing key, or a value out of range."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read the cluster file {path!r}: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a cluster file is a mapping of {', '.join(KEYS)}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; the keys are {', '.join(KEYS)}")
    missing = [k for k in KEYS[:4] if k not in data]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (e.g. device: h100, hosts: 8, "
                         "gpus_per_host: 8, gpu_mem_gib: 80)")  # fmt: skip
    device = str(data["device"]).lower()
    if device not in DEVICES:
        raise ValueError(f"{path}: device {data['device']!r} is not one of {', '.join(DEVICES)}")
    optional = {
        k: _positive(path, k, data[k], int if k == "cores_per_host" else float)
        for k in OPTIONAL
        if data.get(k) is not None
    }
    if "cores_per_host" in optional and device != "cpu":
        raise ValueError(f"{path}: cores_per_host sizes a CPU host's ranks; drop it for {device}")
    return Cluster(
        device,
        _positive(path, "hosts", data["hosts"], int),
        _positive(path, "gpus_per_host", data["gpus_per_host"], int),
        _positive(path, "gpu_mem_gib", data["gpu_mem_gib"], float),
        **optional,
    )
