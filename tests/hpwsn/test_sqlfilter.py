"""The SQL-like filter dialect against the JMS 1.1 selector rules (3.8.1) and seed 002."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from hpwsn import ns
from hpwsn.sqlfilter import (
    FilterError,
    Untyped,
    compare,
    compare_with,
    compile_filter,
    edit_distance,
    message_of,
    parameter_from_text,
)

ALARM = (
    f'<wsnt:Message xmlns:wsnt="{ns.WSNT}">'
    '<a:alarm xmlns:a="urn:alarms" severity="major" id="A-17">'
    "<level>5</level><temp>21.5</temp><name>disk full</name><site>Bei_jing%</site>"
    "<active>true</active><empty></empty><code>007</code>"
    "</a:alarm></wsnt:Message>"
)
PROPS = {
    "$topic": "ALL:ALARM:ALARM1",
    "$producer": "http://sensor-7.example/wsn",
    "$priority": 4,
    "$publishTime": 1_790_000_000_000,
    "$size": 420,
}


def xml_message():  # type: ignore[no-untyped-def]
    return message_of(etree.fromstring(ALARM), properties=PROPS)


def json_message(body: object):  # type: ignore[no-untyped-def]
    el = etree.Element(f"{{{ns.WSNT}}}Message")
    el.text = json.dumps(body)
    return message_of(el, properties=PROPS)


STOCK = {"StockCode": "AAPL", "price": 190.5, "volume": 1200, "halted": False, "note": None}


def run(text: str, message=None, params=()):  # type: ignore[no-untyped-def]
    """The three-valued result: True, False or None (unknown)."""
    return compile_filter(text, params).evaluate(message or xml_message())


# (filter, parameters, result on the XML alarm above); None is SQL's unknown.
XML_CASES = [
    # comparisons, numbers as numbers
    ("alarm.level = 5", (), True),
    ("alarm.level = 5.0", (), True),
    ("alarm.level <> 5", (), False),
    ("alarm.level > 4", (), True),
    ("alarm.level >= 5", (), True),
    ("alarm.level < 5", (), False),
    ("alarm.level <= 4.99", (), False),
    ("alarm.temp > 21.4", (), True),
    ("5 = alarm.level", (), True),
    # strings as strings: the text '007' equals '007' but not 7 compared as text
    ("alarm.code = '007'", (), True),
    ("alarm.code = 7", (), True),  # untyped XML text compared with a number is read as one
    ("alarm.name = 'disk full'", (), True),
    ("alarm.name > 'disc'", (), True),
    ("alarm.name = 5", (), False),  # unlike types: false, not unknown (JMS 3.8.1.2)
    ("alarm.@severity = 'major'", (), True),
    ("alarm.@id = 'A-17'", (), True),
    ("alarm.@missing = 'x'", (), None),
    # booleans
    ("alarm.active = TRUE", (), True),
    ("alarm.active", (), True),
    ("NOT alarm.active", (), False),
    ("alarm.name", (), None),  # a field that is not a boolean is no condition: unknown
    # NULL and three-valued logic (JMS 3.8.1.1 tables)
    ("alarm.missing = 1", (), None),
    ("NOT alarm.missing = 1", (), None),
    ("alarm.missing = 1 AND alarm.level = 5", (), None),
    ("alarm.missing = 1 AND alarm.level = 4", (), False),
    ("alarm.missing = 1 OR alarm.level = 5", (), True),
    ("alarm.missing = 1 OR alarm.level = 4", (), None),
    ("alarm.missing IS NULL", (), True),
    ("alarm.missing IS NOT NULL", (), False),
    ("alarm.level IS NULL", (), False),
    ("alarm.empty IS NULL", (), False),  # present but empty is '' not NULL
    ("alarm.empty = ''", (), True),
    # precedence: NOT > AND > OR; arithmetic: unary > * / > + -
    ("alarm.level = 1 OR alarm.level = 5 AND alarm.temp > 30", (), False),
    ("(alarm.level = 1 OR alarm.level = 5) AND alarm.temp > 30", (), False),
    ("alarm.level = 5 OR alarm.level = 1 AND alarm.temp > 30", (), True),
    ("NOT alarm.level = 1 AND alarm.level = 5", (), True),
    ("alarm.level + 2 * 3 = 11", (), True),
    ("(alarm.level + 2) * 3 = 21", (), True),
    ("alarm.level - 2 - 1 = 2", (), True),
    ("alarm.level / 2 = 2.5", (), True),
    ("-alarm.level = -5", (), True),
    ("alarm.level / 0 = 1", (), None),  # no value: unknown
    ("alarm.name + 1 = 1", (), None),  # text that is no number has no arithmetic value
    ("alarm.missing + 1 = 1", (), None),
    # BETWEEN
    ("alarm.level BETWEEN 1 AND 5", (), True),
    ("alarm.level BETWEEN 6 AND 9", (), False),
    ("alarm.level NOT BETWEEN 6 AND 9", (), True),
    ("alarm.level NOT BETWEEN 1 AND 5", (), False),
    ("alarm.missing BETWEEN 1 AND 5", (), None),
    ("alarm.missing NOT BETWEEN 1 AND 5", (), None),
    ("alarm.name BETWEEN 'a' AND 'e'", (), True),
    # IN
    ("alarm.@severity IN ('minor', 'major')", (), True),
    ("alarm.@severity IN ('minor', 'critical')", (), False),
    ("alarm.@severity NOT IN ('minor', 'critical')", (), True),
    ("alarm.missing IN ('a')", (), None),
    ("alarm.missing NOT IN ('a')", (), None),
    ("alarm.level IN (1, 3, 5)", (), True),
    # LIKE and ESCAPE
    ("alarm.name LIKE 'disk%'", (), True),
    ("alarm.name LIKE 'disk_full'", (), True),
    ("alarm.name LIKE 'dis_'", (), False),
    ("alarm.name LIKE '%FULL'", (), False),  # case matters
    ("alarm.name NOT LIKE 'disk%'", (), False),
    ("alarm.site LIKE 'Bei\\_jing\\%' ESCAPE '\\'", (), True),
    ("alarm.site LIKE 'Bei!_%' ESCAPE '!'", (), True),
    ("alarm.name LIKE 'disk!_full' ESCAPE '!'", (), False),  # the escaped _ is literal
    ("alarm.missing LIKE 'x%'", (), None),
    ("alarm.missing NOT LIKE 'x%'", (), None),
    ("alarm.level LIKE '5'", (), True),  # XML text is text
    # strlike: edit distance (seed 002)
    ("strlike(alarm.name, 'disk full', 0)", (), True),
    ("strlike(alarm.name, 'disc full', 1)", (), True),
    ("strlike(alarm.name, 'disc fall', 1)", (), False),
    ("strlike(alarm.name, 'disc fall', 2)", (), True),
    ("strlike(alarm.name, 'disk ful', 1)", (), True),  # a deletion
    ("strlike(alarm.name, 'disk fulll', 1)", (), True),  # an insertion
    ("strlike(alarm.missing, 'x', 3)", (), None),
    # parameters (seed 002's %n)
    ("alarm.level = %0", (5,), True),
    ("alarm.level BETWEEN %0 AND %1", (1, 4), False),
    ("alarm.@severity IN (%0, %1)", ("minor", "major"), True),
    ("strlike(alarm.name, %0, %1)", ("disk fool", 2), True),
    # properties
    ("$topic = 'ALL:ALARM:ALARM1'", (), True),
    ("$topic LIKE 'ALL:ALARM:%'", (), True),
    ("$producer LIKE '%sensor-7%'", (), True),
    ("$priority >= 4 AND $size < 1000", (), True),
    ("$publishTime > 1700000000000", (), True),
    # keywords in any case
    ("alarm.level between 1 and 5 and not alarm.name like 'x%'", (), True),
]


@pytest.mark.parametrize(("text", "params", "expected"), XML_CASES)
def test_it_evaluates_an_xml_payload_as_the_table_says(text, params, expected):
    assert run(text, params=params) is expected


JSON_CASES = [
    ("StockCode = 'AAPL' OR StockCode = 'MSFT'", True),  # seed 002, figure 2
    ("StockCode = 'IBM' OR StockCode = 'MSFT'", False),  # seed 002, figure 3
    ("price > 190", True),
    ("price BETWEEN 100 AND 200 AND volume >= 1000", True),
    ("volume = 1200.0", True),
    ("StockCode = 1", False),  # a JSON string is a string
    ("halted = FALSE", True),
    ("halted = 0", False),  # a boolean is no number
    ("halted > FALSE", None),  # type error caught at compile time below
    ("note IS NULL", True),  # JSON null is NULL
    ("note = 'x'", None),
    ("missing.deep = 1", None),
]


@pytest.mark.parametrize(("text", "expected"), [c for c in JSON_CASES if "halted >" not in c[0]])
def test_it_evaluates_a_json_payload_with_json_types(text, expected):
    assert run(text, json_message(STOCK)) is expected


def test_json_fields_nest_by_dotted_keys():
    body = {"alarm": {"level": 5, "@severity": "major"}}
    assert run("alarm.level = 5 AND alarm.@severity = 'major'", json_message(body)) is True


def test_a_json_string_is_not_compared_as_a_number():
    assert run("code = 7", json_message({"code": "7"})) is False
    assert run("code = '7'", json_message({"code": "7"})) is True


def test_only_a_true_result_matches():
    f = compile_filter("alarm.missing = 1")
    assert f(xml_message()) is False  # unknown does not match
    assert compile_filter("NOT (alarm.missing = 1)")(xml_message()) is False


def test_a_message_without_payload_fields_still_has_its_properties():
    m = message_of(None, properties=PROPS)
    assert compile_filter("$priority = 4 AND body.x IS NULL")(m) is True


def test_namespaces_do_not_matter_local_names_do():
    other = ALARM.replace("urn:alarms", "urn:other")
    m = message_of(etree.fromstring(other), properties=PROPS)
    assert compile_filter("alarm.level = 5")(m) is True


@pytest.mark.parametrize(
    ("payload", "value"),
    [
        # children in the root's namespace (a default namespace)
        ('<alarm xmlns="urn:a"><site><level>3</level></site></alarm>', 3),
        # unqualified children under a namespaced root (elementFormDefault="unqualified")
        ('<a:alarm xmlns:a="urn:a"><site><level>3</level></site></a:alarm>', 3),
        # a mix: found by local names whatever the namespaces
        ('<a:alarm xmlns:a="urn:a" xmlns:b="urn:b"><b:site><level>3</level></b:site></a:alarm>', 3),
        ('<alarm><b:site xmlns:b="urn:b"><b:level>3</b:level></b:site></alarm>', 3),
        # the root's namespace first, then no namespace, then the first of any namespace
        (
            '<a:alarm xmlns:a="urn:a" xmlns:b="urn:b"><b:site><b:level>1</b:level></b:site>'
            "<a:site><a:level>2</a:level></a:site><site><level>3</level></site></a:alarm>",
            2,
        ),
        (
            '<a:alarm xmlns:a="urn:a" xmlns:b="urn:b"><b:site><b:level>1</b:level></b:site>'
            "<site><level>3</level></site></a:alarm>",
            3,
        ),
        (
            '<alarm xmlns:b="urn:b"><b:site><b:level>1</b:level></b:site>'
            "<site><level>3</level></site></alarm>",
            1,
        ),
        # the payload root need not be the first child of wsnt:Message
        ("<!-- a comment --><other/><alarm><site><level>3</level></site></alarm>", 3),
        ('<alarm xmlns="urn:a"><site><other>3</other></site></alarm>', None),
    ],
)
def test_a_field_is_found_by_local_names_in_a_fixed_order_of_namespaces(payload, value):
    doc = f'<wsnt:Message xmlns:wsnt="{ns.WSNT}">{payload}</wsnt:Message>'
    m = message_of(etree.fromstring(doc))
    assert m.get("alarm.site.level") == (None if value is None else str(value))
    assert compile_filter("alarm.site.level IS NULL")(m) is (value is None)


def test_one_parsed_text_serves_many_parameter_lists():
    text = "alarm.@severity = %0"
    assert compile_filter(text, ["major"])(xml_message()) is True
    assert compile_filter(text, ["minor"])(xml_message()) is False


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10", 10),
        ("2.5", 2.5),
        ("'AAPL'", "AAPL"),
        ("'it''s'", "it's"),
        ("TRUE", True),
        ("AAPL", "AAPL"),
        ("-3", -3),
    ],
)
def test_a_soap_parameter_is_read_as_a_literal(text, value):
    assert parameter_from_text(text) == value
    assert type(parameter_from_text(text)) is type(value)


# ----------------------------------------------------------------------------- faults

FAULTS = [
    # (filter, params, column, a word of what was expected or said)
    ("alarm.level = ", (), 15, "a number"),
    ("alarm.level == 5", (), 14, "a field name"),
    ("alarm.level = 5 AND", (), 20, "a field name"),
    ("alarm.level = 5)", (), 16, "the end of the filter"),
    ("(alarm.level = 5", (), 17, "')'"),
    ("alarm.name = 'unterminated", (), 14, "unexpected character"),
    ("alarm.level # 5", (), 13, "unexpected character '#'"),
    ("alarm.level BETWEEN 1 5", (), 23, "AND"),
    ("alarm.level IN ()", (), 17, "a number"),
    ("alarm.name LIKE alarm.x", (), 17, "a 'string'"),
    ("'x' = 1", (), 7, "a string is compared with a number"),
    ("'a' + 1 > 2", (), 1, "'+' cannot take a string"),
    ("alarm.level = 1 AND 5", (), 21, "not a condition"),
    ("TRUE > FALSE", (), 8, "booleans cannot be compared with >"),
    ("5 LIKE 'x'", (), 1, "LIKE cannot take a number"),
    ("alarm.name LIKE 'x' ESCAPE 'ab'", (), 28, "exactly one character"),
    ("alarm.name LIKE 'x!' ESCAPE '!'", (), 17, "ends with its escape"),
    ("alarm.level = %2", (1,), 15, "parameter %2 has no value"),
    ("$nope = 1", (), 1, "$topic"),
    ("$priority = 'high'", (), 13, "a number is compared with a string"),
    ("", (), 1, "empty"),
    ("alarm.level > AND x = 1", (), 15, "unexpected 'AND'"),  # reserved words are no fields
    ("alarm.level = null", (), 15, "unexpected 'null'"),
]


@pytest.mark.parametrize(("text", "params", "column", "words"), FAULTS)
def test_a_bad_filter_names_the_position_and_what_was_expected(text, params, column, words):
    with pytest.raises(FilterError) as caught:
        compile_filter(text, params)
    assert caught.value.position == column, str(caught.value)
    assert words in str(caught.value)


def test_a_producer_filter_may_name_properties_only():
    compile_filter("$producer LIKE 'http://sensor%'", producer_only=True)
    with pytest.raises(FilterError, match="not a producer property"):
        compile_filter("alarm.level = 5", producer_only=True)


def test_an_oversized_filter_is_refused_before_parsing():
    with pytest.raises(FilterError, match="longer than"):
        compile_filter("a = 1 OR " * 2000 + "a = 1")


# ----------------------------------------------------------------------------- properties

texts = st.text(alphabet="abc _%!", max_size=8)


@settings(max_examples=300, deadline=None)
@given(a=st.text(alphabet="abcd", max_size=8), b=st.text(alphabet="abcd", max_size=8))
def test_edit_distance_is_levenshtein(a, b):
    # The reference: the full dynamic programme, no early exit.
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
    full = d[len(a)][len(b)]
    for limit in range(0, 10):
        assert (edit_distance(a, b, limit) <= limit) == (full <= limit)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False),
    st.sampled_from(["a", "b", "1", "2.0", "true"]),
    st.sampled_from(["a", "1", "2.0", "true", " 3 "]).map(Untyped),
)


@settings(max_examples=500, deadline=None)
@given(a=scalars, b=scalars)
def test_comparisons_obey_three_valued_logic(a, b):
    eq, ne = compare("=", a, b), compare("<>", a, b)
    if a is None or b is None:
        assert eq is None
        assert ne is None
    else:
        assert eq is not None
        assert ne is not None
        # Unlike types are neither equal nor, for <>, unequal in a way that matches both.
        assert not (eq and ne)
        assert compare("=", b, a) == eq  # symmetric


@settings(max_examples=300, deadline=None)
@given(x=st.one_of(st.none(), st.integers(-3, 3)), lo=st.integers(-3, 3), hi=st.integers(-3, 3))
def test_not_between_is_the_negation_of_between_in_three_valued_logic(x, lo, hi):
    m = json_message({"x": x})
    inside = run(f"x BETWEEN {lo} AND {hi}", m)
    outside = run(f"x NOT BETWEEN {lo} AND {hi}", m)
    assert outside is (None if inside is None else not inside)
    assert run(f"NOT (x BETWEEN {lo} AND {hi})", m) is outside


@settings(max_examples=300, deadline=None)
@given(value=st.text(alphabet="ab_%!", max_size=6), pattern=texts)
def test_like_agrees_with_a_reference_matcher(value, pattern):
    import fnmatch

    # The reference: LIKE without ESCAPE is fnmatch with % as * and _ as ?, on text without
    # fnmatch's own specials.
    if any(c in pattern or c in value for c in "*?[]!"):
        return
    translated = pattern.replace("%", "*").replace("_", "?")
    expected = fnmatch.fnmatchcase(value, translated)
    literal = "'" + pattern.replace("'", "''") + "'"
    assert run(f"v LIKE {literal}", json_message({"v": value})) is expected


@settings(max_examples=1000, deadline=None)
@given(
    op=st.sampled_from(["=", "<>", "<", ">", "<=", ">="]),
    x=scalars,
    c=st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from([1.0, "1", "a"])),
)
def test_the_specialised_comparison_with_a_constant_answers_as_compare_does(op, x, c):
    assert compare_with(op, c)(x) is compare(op, x, c)
