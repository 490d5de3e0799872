"""Every non-public address class, including IPv6 forms that embed IPv4."""

from __future__ import annotations

import pytest

from policy import AddressClass, classify_address

C = AddressClass

CLASSES = [
    pytest.param("8.8.8.8", C.PUBLIC, None, id="public-v4"),
    pytest.param("2606:4700::1111", C.PUBLIC, None, id="public-v6"),
    pytest.param("127.0.0.1", C.LOOPBACK, None, id="loopback"),
    pytest.param("127.255.0.9", C.LOOPBACK, None, id="loopback-range"),
    pytest.param("::1", C.LOOPBACK, None, id="loopback-v6"),
    pytest.param("0.0.0.0", C.UNSPECIFIED, None, id="unspecified"),
    pytest.param("::", C.UNSPECIFIED, None, id="unspecified-v6"),
    pytest.param("169.254.169.254", C.METADATA, None, id="metadata-aws-gcp-azure"),
    pytest.param("169.254.170.2", C.METADATA, None, id="metadata-ecs"),
    pytest.param("100.100.100.200", C.METADATA, None, id="metadata-alibaba"),
    pytest.param("fd00:ec2::254", C.METADATA, None, id="metadata-aws-v6"),
    pytest.param("169.254.1.1", C.LINK_LOCAL, None, id="link-local"),
    pytest.param("fe80::1", C.LINK_LOCAL, None, id="link-local-v6"),
    pytest.param("10.0.0.1", C.PRIVATE, None, id="rfc1918-10"),
    pytest.param("172.16.0.1", C.PRIVATE, None, id="rfc1918-172"),
    pytest.param("172.31.255.255", C.PRIVATE, None, id="rfc1918-172-top"),
    pytest.param("172.32.0.1", C.PUBLIC, None, id="rfc1918-172-outside"),
    pytest.param("192.168.1.1", C.PRIVATE, None, id="rfc1918-192"),
    pytest.param("100.64.0.1", C.CGNAT, None, id="cgnat"),
    pytest.param("100.127.255.255", C.CGNAT, None, id="cgnat-top"),
    pytest.param("fc00::1", C.ULA, None, id="ula-fc"),
    pytest.param("fd12:3456::1", C.ULA, None, id="ula-fd"),
    pytest.param("224.0.0.1", C.MULTICAST, None, id="multicast"),
    pytest.param("ff02::1", C.MULTICAST, None, id="multicast-v6"),
    pytest.param("255.255.255.255", C.RESERVED, None, id="broadcast"),
    pytest.param("240.0.0.1", C.RESERVED, None, id="class-e"),
    pytest.param("192.0.2.1", C.RESERVED, None, id="test-net-1"),
    pytest.param("198.18.0.1", C.RESERVED, None, id="benchmarking"),
    pytest.param("0.1.2.3", C.RESERVED, None, id="this-network"),
    pytest.param("2001:db8::1", C.RESERVED, None, id="documentation-v6"),
    pytest.param("4000::1", C.RESERVED, None, id="outside-global-unicast"),
    pytest.param("::ffff:127.0.0.1", C.LOOPBACK, None, id="mapped-loopback"),
    pytest.param("::ffff:a9fe:a9fe", C.METADATA, None, id="mapped-metadata"),
    pytest.param("64:ff9b::7f00:1", C.LOOPBACK, "nat64", id="nat64-loopback"),
    pytest.param("64:ff9b::a9fe:a9fe", C.METADATA, "nat64", id="nat64-metadata"),
    pytest.param("64:ff9b::808:808", C.PUBLIC, None, id="nat64-public"),
    pytest.param("64:ff9b:1::1", C.RESERVED, None, id="nat64-local-use"),
    pytest.param("2002:a00:1::1", C.PRIVATE, "6to4", id="6to4-private"),
    pytest.param("2002:7f00:1::1", C.LOOPBACK, "6to4", id="6to4-loopback"),
    pytest.param("2002:808:808::1", C.PUBLIC, None, id="6to4-public"),
    # Teredo stores the client address inverted (RFC 4380): 80ff:fffe -> 127.0.0.1
    pytest.param(
        "2001:0:4136:e378:8000:63bf:80ff:fffe", C.LOOPBACK, "teredo", id="teredo-loopback"
    ),
    pytest.param("2001:0:4136:e378:8000:63bf:f5ff:fffe", C.PRIVATE, "teredo", id="teredo-private"),
    pytest.param("2001:0:a00:1::f7f7:f7f7", C.PRIVATE, "teredo", id="teredo-private-server"),
]


@pytest.mark.parametrize(("address", "klass", "via"), CLASSES)
def test_classify(address: str, klass: AddressClass, via: str | None) -> None:
    info = classify_address(address)
    assert (info.klass, info.via) == (klass, via)
    assert info.public is (klass is C.PUBLIC)


def test_describe_names_the_class_and_embedding() -> None:
    assert classify_address("64:ff9b::a9fe:a9fe").describe() == (
        "64:ff9b::a9fe:a9fe (metadata, embedded via nat64)"
    )
    assert classify_address("::ffff:127.0.0.1").describe() == "127.0.0.1 (loopback)"
