import pytest

from hpwsn import ns
from hpwsn.topicexpr import TopicExpressionError, UnknownDialectError, parse, split_colon_path

NS = {"tns": "urn:alarms", "o": "urn:objects"}
ALARM1 = ("ALL", "ALARM", "ALARM1")


@pytest.mark.parametrize(
    ("text", "dialect", "names"),
    [
        ("tns:ALL", ns.DIALECT_SIMPLE, ("ALL",)),
        ("ALL:ALARM:ALARM1", ns.DIALECT_SIMPLE, ALARM1),
        ("ALL:ALARM:ALARM1", None, ALARM1),
        ("ALL:ALARM", ns.DIALECT_COLON, ("ALL", "ALARM")),
        ("tns:ALL/ALARM/ALARM1", ns.DIALECT_CONCRETE, ALARM1),
        ("tns:ALL/tns:ALARM", ns.DIALECT_CONCRETE, ("ALL", "ALARM")),
        ("tns:ALL/ALARM", ns.DIALECT_FULL, ("ALL", "ALARM")),
    ],
)
def test_it_reads_concrete_paths_in_every_dialect(text, dialect, names):
    expr = parse(text, dialect, NS)
    assert expr.is_concrete
    assert expr.concrete()[1] == names


def test_a_prefix_resolves_through_the_namespaces_in_scope():
    expr = parse("tns:ALL", ns.DIALECT_SIMPLE, NS)
    assert expr.concrete()[0] == "urn:alarms"
    assert expr.covers("urn:alarms", ALARM1)
    assert not expr.covers("urn:other", ALARM1)
    assert expr.covers(None, ALARM1)  # a root without a namespace matches any namespace


def test_equal_expressions_with_different_prefixes_are_canonically_equal():
    a = parse("tns:ALL/ALARM", ns.DIALECT_CONCRETE, {"tns": "urn:x"})
    b = parse("q:ALL/ALARM", ns.DIALECT_CONCRETE, {"q": "urn:x"})
    assert a.canonical() == b.canonical()


@pytest.mark.parametrize(
    ("text", "covered", "not_covered"),
    [
        ("tns:ALL", [ALARM1, ("ALL",)], [("Object",)]),
        ("tns:ALL/ALARM/ALARM1", [ALARM1, (*ALARM1, "ALARM11")], [("ALL", "ALARM")]),
        ("o:Object/Food/*", [("Object", "Food", "Fruit", "Apple"), ("Object", "Food", "Bread")],
         [("Object", "Tool"), ("Object", "Food")]),
        ("tns:ALL//ALARM11", [(*ALARM1, "ALARM11")], [ALARM1]),
        ("//ALARM1", [ALARM1], [("ALL", "ALARM")]),
        ("tns:ALL//.", [("ALL",), ALARM1], [("Object",)]),
        ("o:Object/Tool|tns:ALL/ALARM", [("Object", "Tool"), ALARM1], [("Object", "Food")]),
        ("tns:*", [("ALL",), ("Object", "Tool")], []),
    ],
)  # fmt: skip
def test_full_expressions_cover_subtrees(text, covered, not_covered):
    expr = parse(text, ns.DIALECT_FULL, NS)
    for names in covered:
        assert expr.covers(None, names), names
    for names in not_covered:
        assert not expr.covers(None, names), names


@pytest.mark.parametrize(
    ("text", "dialect", "fragment"),
    [
        ("", ns.DIALECT_SIMPLE, "empty"),
        ("a b", None, "not a valid topic name"),
        ("foo:ALL/ALARM", ns.DIALECT_CONCRETE, "prefix 'foo'"),
        ("tns:ALL/ALARM", ns.DIALECT_SIMPLE, "Simple dialect"),
        ("tns:ALL//", ns.DIALECT_FULL, "ends with '/'"),
        ("tns:ALL///x", ns.DIALECT_FULL, "empty step"),
        ("/ALL", ns.DIALECT_FULL, "single '/'"),
        ("tns:ALL/*", ns.DIALECT_CONCRETE, "not a concrete path"),
        (":".join(["A"] * 17), ns.DIALECT_COLON, "deeper than 16"),
    ],
)
def test_it_rejects_invalid_expressions_and_says_why(text, dialect, fragment):
    with pytest.raises(TopicExpressionError, match=fragment):
        parse(text, dialect, NS)


def test_an_unknown_dialect_is_its_own_error():
    with pytest.raises(UnknownDialectError, match="urn:nope"):
        parse("ALL", "urn:nope", NS)


def test_colon_paths_split_into_names():
    assert split_colon_path("ALL:ALARM") == ("ALL", "ALARM")
    with pytest.raises(TopicExpressionError):
        split_colon_path("ALL::ALARM")
