"""acare_ray.testing.free_port / free_ports: the one home of the free-port helper that
benchmarks (and tests) share instead of each keeping a copy."""

import socket

from acare_ray.testing import free_port, free_ports


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    sockets = []
    try:
        for port in ports:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in sockets:
            s.close()


def test_free_port_is_bindable():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
