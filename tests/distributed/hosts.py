"""Several "hosts" on one machine: network namespaces on a bridge, each with its own host name
(a UTS namespace) and, optionally, its link rate-shaped with tc's token bucket (tbf).

    with emulated_hosts(4, rate="1gbit") as hosts:      # host i: 10.77.0.(i + 1), "host<i>"
        argv = in_host(hosts[i], i, ["python", "train.py"])

The bridge lives in a namespace of its own (the "switch"); host i's veth pair joins its namespace
to it. With `rate`, both ends of every host's pair are shaped, so a host sends and receives at
most `rate` (what a host's network card allows), while traffic between two ranks of one host never
touches the link (it goes through shared memory, or loopback). This kernel has no netem, so
latency cannot be added; only the rate is shaped. Everything is removed on exit, whatever
happened, and the addresses are a private range used only inside these namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import uuid
from typing import NamedTuple

SUBNET = "10.77.{}.{}"  # addresses of these test hosts only, inside namespaces made here
# Named link profiles (tc rate syntax); any tc rate ("250mbit") is accepted as well.
PROFILES = {"10gbit": "10gbit", "1gbit": "1gbit", "100mbit": "100mbit"}


class Host(NamedTuple):
    namespace: str
    address: str
    interface: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _tc(namespace: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], check=True,
                   capture_output=True, text=True)  # fmt: skip


def rate_bits(rate: str) -> int:
    """Bits per second of a tc rate ("1gbit", "100mbit", "500kbit"); ValueError names the form."""
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit) and rate[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(rate[: -len(unit)]) * scale)
    raise ValueError(f"rate {rate!r}: give a tc rate such as 10gbit, 1gbit or 100mbit")


def _shape(namespace: str, interface: str, rate: str) -> None:
    """tbf on `interface`'s egress: `rate`, a bucket of 2 ms at that rate (at least 64 KiB, so
    a segmentation-offloaded packet fits), and at most 50 ms of queue."""
    burst = max(64 << 10, rate_bits(rate) // 8 // 500)
    _tc(namespace, "qdisc", "add", "dev", interface, "root", "tbf", "rate", rate,
        "burst", str(burst), "latency", "50ms")  # fmt: skip


@contextlib.contextmanager
def emulated_hosts(count: int, rate: str | None = None):
    """Yields `count` Hosts on one bridge, each link shaped to `rate` (None: unshaped)."""
    if count < 1 or count > 250:
        raise ValueError(f"count {count}: give between 1 and 250 hosts")
    if rate is not None:
        rate_bits(PROFILES.get(rate, rate))
    tag = uuid.uuid4().hex[:6]
    switch = f"sw-{tag}-switch"
    made = [switch]
    hosts: list[Host] = []
    try:
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i in range(count):
            host = Host(f"sw-{tag}-h{i}", SUBNET.format(0, i + 1), f"sw{tag}h{i}")
            port = f"sw{tag}p{i}"
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            _ip("link", "add", host.interface, "netns", host.namespace, "type", "veth", "peer",
                "name", port, "netns", switch)  # fmt: skip
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            if rate is not None:
                _shape(host.namespace, host.interface, PROFILES.get(rate, rate))
                _shape(switch, port, PROFILES.get(rate, rate))
            hosts.append(host)
        yield hosts
    finally:
        for name in reversed(made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def two_hosts():
    """Yields two unshaped Hosts (namespace, address, interface): host 0 and host 1."""
    with emulated_hosts(2) as hosts:
        yield hosts


def in_host(host: Host, index: int, argv: list[str], cores: int | None = None) -> list[str]:
    """`argv` run inside `host`'s namespace under the host name "host<index>"; with `cores`,
    on this host's own cores only (host i: cores i * cores ... (i + 1) * cores - 1, taskset),
    as a real host computes on its own CPU."""
    shell = f'hostname host{index} && exec "$0" "$@"'
    pinned = []
    if cores is not None:
        first = index * cores
        if first + cores > (os.cpu_count() or 1):
            raise ValueError(
                f"cores {cores}: host {index} needs cores {first}..{first + cores - 1}"
                f", this machine has {os.cpu_count()}; give fewer hosts or cores"
            )
        pinned = ["taskset", "-c", f"{first}-{first + cores - 1}"]
    namespace = ["ip", "netns", "exec", host.namespace, "unshare", "--uts"]
    return [*namespace, *pinned, "sh", "-c", shell, *argv]


def start_ranks(
    hosts: list[Host],
    per_host: int,
    argv: list[str],
    port: str,
    env_extra: dict | None = None,
    cores: int | None = None,
) -> list[subprocess.Popen]:
    """len(hosts) * per_host ranks of `argv`, rank r on host r // per_host, each with torchrun's
    variables (the store on host 0 at `port`) and its host's interface named to gloo and
    shardwise; with `cores`, each host's ranks on that many cores of their own (`in_host`);
    stdout and stderr piped."""  # fmt: skip
    world, procs = len(hosts) * per_host, []
    commands = [in_host(host, i, argv, cores) for i, host in enumerate(hosts)]  # before any starts
    for rank in range(world):
        host = hosts[rank // per_host]
        env = dict(os.environ, MASTER_ADDR=hosts[0].address, MASTER_PORT=port, RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                   LOCAL_WORLD_SIZE=str(per_host), OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME=host.interface, SHARDWISE_SOCKET_IFNAME=host.interface,
                   **(env_extra or {}))  # fmt: skip
        procs.append(subprocess.Popen(commands[rank // per_host], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    return procs


def training_arguments(parser, hosts: int, steps: int) -> None:
    """The arguments every training benchmark across emulated hosts takes: --hosts,
    --ranks-per-host, --rate, the bundled GPT's --preset, --steps and --micro (and the hidden
    --worker its ranks run under)."""
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", type=int, default=hosts)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="each host's link: 10gbit, 1gbit, "
                        "100mbit, any tc rate, or none (unshaped)")  # fmt: skip
    parser.add_argument("--preset", default="small", help="the bundled GPT's preset")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--micro", type=int, default=1, help="sequences per rank and step")


def rate_argument(parser, rate: str) -> str | None:
    """A benchmark's --rate as emulated_hosts takes it (None for "none": unshaped), once the
    rate reads as a tc rate and namespaces can be made here; else `parser.error` says why,
    before any namespace is made."""
    try:
        if rate != "none":
            rate_bits(PROFILES.get(rate, rate))
    except ValueError as e:
        parser.error(f"--rate: {e}")
    reason = can_make_namespaces()
    if reason:
        parser.error(f"cannot make network namespaces here: {reason}")
    return None if rate == "none" else rate


def can_make_namespaces() -> str:
    """'' when namespaces (and tc's tbf) can be made here, else the reason they cannot."""
    probe = f"sw-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
            _tc(probe, "qdisc", "add", "dev", "probe0", "root", "tbf", "rate", "1gbit",
                "burst", "65536", "latency", "50ms")  # fmt: skip
        finally:
            _ip("netns", "del", probe)
        subprocess.run(["unshare", "--uts", "true"], check=True, capture_output=True)
        return ""
    except FileNotFoundError as e:
        return f"missing tool: {e.filename}"
    except subprocess.CalledProcessError as e:
        return f"{' '.join(e.cmd)} failed: {e.stderr.strip() if e.stderr else e.returncode}"
