"""Topic and namespace names (broker/topic_name.py).

What it proves: full names parse into their four parts and print back unchanged; short
forms are completed as Pulsar's clients complete them (``t`` is
``persistent://public/default/t``, ``tenant/ns/t`` gets the persistent domain); only the
persistent domain is served; every malformed name (bad tenant or namespace characters,
control characters, a trailing newline, an empty part, too many bytes, a '/' in the
local name) raises InvalidArgument and nothing else; partition suffixes are recognised
exactly as Pulsar does (no leading zeros, no negative index); and the metadata key path
encodes any local name as one segment, injectively.

How: tables of (input, expected) and of invalid inputs.
"""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from common.topic_name import NAME_BYTES_MAX, NamespaceName, TopicName, validate_name_part
from common.errors import InvalidArgument, MagnetarError, NotAllowed


@pytest.mark.parametrize("text, expected", [
    ("persistent://acme/orders/created", ("persistent", "acme", "orders", "created")),
    ("my-topic", ("persistent", "public", "default", "my-topic")),
    ("acme/orders/created", ("persistent", "acme", "orders", "created")),
    ("persistent://public/default/t-partition-7", ("persistent", "public", "default", "t-partition-7")),
    # Pulsar's tenant/namespace alphabet: word characters and - = : .
    ("persistent://a-b_c=d:e.f/n.s-1/t", ("persistent", "a-b_c=d:e.f", "n.s-1", "t")),
    # Local names are free-form apart from '/', whitespace and control characters.
    ("persistent://t/ns/with+plus?and#hash%and:colon", ("persistent", "t", "ns", "with+plus?and#hash%and:colon")),
    ("persistent://t/ns/ünïcödé", ("persistent", "t", "ns", "ünïcödé")),
])
def test_names_parse_into_their_parts(text: str, expected: tuple[str, str, str, str]):
    """Each accepted form gives the expected (domain, tenant, namespace, local name)."""
    name = TopicName.parse(text)
    assert (name.domain, name.tenant, name.namespace, name.local_name) == expected


def test_short_forms_complete_to_the_full_name_and_compare_equal():
    """``t``, ``public/default/t`` and the full name are the same topic: equal, same
    hash (usable as one dict key) and the same string."""
    forms = ["orders", "public/default/orders", "persistent://public/default/orders"]
    names = [TopicName.parse(form) for form in forms]
    assert all(name == names[0] for name in names)
    assert len({name: None for name in names}) == 1
    assert {str(name) for name in names} == {"persistent://public/default/orders"}


@pytest.mark.parametrize("text", [
    "persistent://acme/orders/created",
    "persistent://t/ns/with+plus?and#hash%and:colon",
    "persistent://t/ns/x-partition-12",
])
def test_full_names_print_back_unchanged(text: str):
    """str() of a parsed full name is the input, and parsing it again gives the same name."""
    assert str(TopicName.parse(text)) == text
    assert TopicName.parse(str(TopicName.parse(text))) == TopicName.parse(text)


@pytest.mark.parametrize("text", [
    "",                                     # empty
    "http://public/default/t",              # not a topic domain at all
    "persistent://public/default",          # no local name
    "persistent://public/default/",         # empty local name
    "persistent:///default/t",              # empty tenant
    "persistent://public//t",               # empty namespace
    "public/t",                             # two parts: neither short nor full
    "persistent://public/default/a/b",      # '/' in the local name (Pulsar's old v1 form)
    "persistent://pub lic/default/t",       # space in the tenant
    "persistent://public/def/ault/t",       # too many parts
    "persistent://public/default/t\x00",    # control characters in the local name
    "persistent://public/default/line\nbreak",
    "persistent://public/default/my topic",  # whitespace in the local name (issue 39)
    "my topic",
    "persistent://public/default/tab\tbed",
    "persistent://public/default/no\u00a0break",
    "persistent://pub*lic/default/t",       # '*' is not in the tenant alphabet
    "persistent://public/de%fault/t",       # nor '%'
])
def test_malformed_names_raise_invalid_argument(text: str):
    """Only InvalidArgument (400, the caller's fault), with a message naming the fault."""
    with pytest.raises(InvalidArgument) as caught:
        TopicName.parse(text)
    assert caught.value.code == 1002 and caught.value.http_status == 400
    assert caught.value.message


@pytest.mark.parametrize("text", [
    "persistent://public\n/default/t",
    "persistent://public/default\n/t",
    "public/default\n/t",
])
def test_a_trailing_newline_in_tenant_or_namespace_is_refused(text: str):
    """A regex ``$`` also matches before a final newline: "default\\n" must not pass as
    a namespace name (it would become a second namespace whose etcd keys hold a
    newline)."""
    with pytest.raises(InvalidArgument):
        TopicName.parse(text)
    with pytest.raises(InvalidArgument):
        NamespaceName.parse("public/default\n")
    with pytest.raises(InvalidArgument):
        validate_name_part("cluster-a\n", "cluster")


def test_domain_is_named_in_the_refusal_of_non_persistent_topics():
    """The refusal says which domain was asked for, so the user sees why; it is
    NotAllowed (the official clients fail at once on NotAllowedError, while they retry
    InvalidTopicName until their operation timeout)."""
    with pytest.raises(NotAllowed, match="non-persistent"):
        TopicName.parse("non-persistent://public/default/t")


def test_name_length_is_bounded_in_bytes_not_characters():
    """NAME_BYTES_MAX counts UTF-8 bytes: a name of exactly that many bytes passes, one
    byte more is refused, and two-byte characters count twice."""
    prefix = "persistent://public/default/"
    exact = prefix + "x" * (NAME_BYTES_MAX - len(prefix))
    assert len(exact.encode()) == NAME_BYTES_MAX
    assert TopicName.parse(exact).local_name == exact[len(prefix):]
    with pytest.raises(InvalidArgument):
        TopicName.parse(exact + "x")
    two_byte = prefix + "é" * ((NAME_BYTES_MAX - len(prefix)) // 2 + 1)
    assert len(two_byte) <= NAME_BYTES_MAX < len(two_byte.encode())
    with pytest.raises(InvalidArgument):
        TopicName.parse(two_byte)


@pytest.mark.parametrize("local_name, index, parent", [
    ("t-partition-0", 0, "t"),
    ("t-partition-7", 7, "t"),
    ("t-partition-123", 123, "t"),
    ("a-partition-1-partition-2", 2, "a-partition-1"),   # the last suffix counts
    ("t", -1, "t"),
    ("t-partition-", -1, "t-partition-"),
    ("t-partition-01", -1, "t-partition-01"),             # leading zero: not a partition (as Pulsar)
    ("t-partition--1", -1, "t-partition--1"),             # negative: not a partition
    ("t-partition-x", -1, "t-partition-x"),
    ("-partition-3", -1, "-partition-3"),                 # no base name
    ("t-partition-3x", -1, "t-partition-3x"),
])
def test_partition_suffixes(local_name: str, index: int, parent: str):
    """partition_index, is_partition and partitioned_parent for each suffix form, as Pulsar reads them."""
    name = TopicName.from_parts("public", "default", local_name)
    assert name.partition_index == index
    assert name.is_partition == (index >= 0)
    assert name.partitioned_parent == TopicName.from_parts("public", "default", parent)


def test_partition_and_parent_are_inverse():
    """partition(i) names ``<t>-partition-i`` in the same namespace, whose index is i and
    whose parent is t again."""
    parent = TopicName.parse("persistent://acme/orders/created")
    for index in (0, 1, 9, 10, 99, 1000):
        partition = parent.partition(index)
        assert str(partition) == f"persistent://acme/orders/created-partition-{index}"
        assert partition.partition_index == index
        assert partition.partitioned_parent == parent
        assert partition.namespace_name == parent.namespace_name == NamespaceName("acme", "orders")
        assert TopicName.parse(str(partition)) == partition


def test_from_parts_validates_like_parse():
    """from_parts builds the same name as parse and refuses the same bad parts."""
    assert TopicName.from_parts("acme", "orders", "x") == TopicName.parse("acme/orders/x")
    for tenant, namespace, local_name in (("", "ns", "t"), ("a b", "ns", "t"), ("t", "ns", ""), ("t", "ns", "a/b")):
        with pytest.raises(InvalidArgument):
            TopicName.from_parts(tenant, namespace, local_name)


@pytest.mark.parametrize("text, ok", [
    ("public/default", True),
    ("acme/orders.v2", True),
    ("public", False),
    ("public/default/extra", False),
    ("/default", False),
    ("public/", False),
    ("pub lic/default", False),
    ("", False),
])
def test_namespace_names(text: str, ok: bool):
    """tenant/namespace parses and prints back; any other shape is InvalidArgument."""
    if ok:
        parsed = NamespaceName.parse(text)
        assert str(parsed) == text
        assert NamespaceName.parse(str(parsed)) == parsed
    else:
        with pytest.raises(InvalidArgument):
            NamespaceName.parse(text)


@pytest.mark.parametrize("local_name, encoded", [
    ("plain-name_1.2", "plain-name_1.2"),
    ("with+plus", "with%2Bplus"),
    ("a%b", "a%25b"),
    ("a%25b", "a%2525b"),
    ("q?x=1#f", "q%3Fx%3D1%23f"),
    ("colon:name", "colon%3Aname"),
    ("é", "%C3%A9"),
])
def test_key_path_encodes_the_local_name_as_one_segment(local_name: str, encoded: str):
    """The key path is persistent/tenant/ns/<percent-encoded local name>: four segments
    whatever the name holds, decoding back to the local name."""
    name = TopicName.from_parts("acme", "orders", local_name)
    assert name.key_path == f"persistent/acme/orders/{encoded}"
    segments = name.key_path.split("/")
    assert len(segments) == 4
    assert unquote(segments[3]) == local_name
    assert name.rest_path == name.key_path


def test_key_paths_are_injective():
    """Distinct topics never share a key path, even when one name looks like another's
    encoding."""
    local_names = ["a", "a=b", "a%20b", "a%2520b", "a+b", "A", "a-b", "a.b", "a%", "%", "%25", "é", "%C3%A9"]
    names = [TopicName.from_parts("t", "ns", n) for n in local_names]
    names += [TopicName.from_parts("t", "ns2", "a"), TopicName.from_parts("t2", "ns", "a")]
    assert len({n.key_path for n in names}) == len(names)


def test_invalid_input_never_raises_anything_but_our_error():
    """A spread of garbage: every refusal is a MagnetarError, never a ValueError or
    IndexError escaping from the parser."""
    garbage = ["://", ":///", "persistent://", "persistent:///", "a//b", "//", "/", "///a",
               "persistent://a/b/c://d", "\x7f", "\n", "persistent://a/b/\t"]
    for text in garbage:
        try:
            TopicName.parse(text)
        except MagnetarError as error:
            assert isinstance(error, InvalidArgument), (text, error)
