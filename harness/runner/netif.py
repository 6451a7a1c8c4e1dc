"""``python -m harness.runner.netif ADDRESS``: print the network interface that holds ADDRESS.

launch.sh binds gloo (``GLOO_SOCKET_IFNAME``) and NCCL's bootstrap (``NCCL_SOCKET_IFNAME``) to that
interface on multi-node runs when the inventory sets neither: a node's hostname may resolve to a
loopback address (Debian and Ubuntu map it to 127.0.1.1; namespaced or containerised nodes may share
one hostname), and a rank that advertises 127.x makes every other node connect to itself. The
inventory already knows each host's address; this finds which interface carries it, at run time, on
the node itself. Exit 1 (nothing printed) when no interface holds it.
"""

from __future__ import annotations

import ipaddress
import socket
import sys

import psutil


def addresses_of(name: str) -> set[str]:
    """*name* (an IP literal or a DNS name) as the set of IP addresses it stands for."""
    try:
        return {str(ipaddress.ip_address(name))}
    except ValueError:
        pass
    try:
        # An IPv4/IPv6 sockaddr starts with the host string; skip any other shape getaddrinfo may hand back.
        return {str(ipaddress.ip_address(info[4][0].split("%")[0])) for info in socket.getaddrinfo(name, None)
                if isinstance(info[4][0], str)}
    except (OSError, ValueError):
        return set()


def interface_for(address: str) -> str | None:
    wanted = addresses_of(address)
    if not wanted:
        return None
    for ifname, addrs in sorted(psutil.net_if_addrs().items()):
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    if str(ipaddress.ip_address(a.address.split("%")[0])) in wanted:
                        return ifname
                except ValueError:
                    continue
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m harness.runner.netif ADDRESS\n")
        return 2
    name = interface_for(argv[0])
    if name is None:
        return 1
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
