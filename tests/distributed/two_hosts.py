"""Two "hosts" on one machine: network namespaces joined by a veth pair, each with its own
hostname (a UTS namespace), so the backend sees two hosts and connects them over TCP."""

import contextlib
import subprocess
import uuid

SUBNET = "10.77.{}.{}"  # addresses of these test hosts only, inside namespaces made here


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def two_hosts():
    """Yields [(namespace, address, interface)] for host 0 and host 1; removes them after."""
    tag = uuid.uuid4().hex[:6]
    names = [f"sw-{tag}-h0", f"sw-{tag}-h1"]
    links = [f"sw{tag}a", f"sw{tag}b"]
    addresses = [SUBNET.format(0, 1), SUBNET.format(0, 2)]
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for name, link, address in zip(names, links, addresses, strict=True):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield list(zip(names, addresses, links, strict=True))
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def can_make_namespaces() -> str:
    """'' when namespaces can be made here, else the reason they cannot."""
    probe = f"sw-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
        subprocess.run(["unshare", "--uts", "true"], check=True, capture_output=True)
        return ""
    except FileNotFoundError as e:
        return f"missing tool: {e.filename}"
    except subprocess.CalledProcessError as e:
        return f"{' '.join(e.cmd)} failed: {e.stderr.strip() if e.stderr else e.returncode}"
