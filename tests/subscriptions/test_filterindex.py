"""The filter index answers exactly what evaluating every filter one by one answers."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from hpwsn import ns
from hpwsn.sqlfilter import FilterError, compile_filter, message_of
from subscriptions.filterindex import FilterIndex, linear_matching

FIELDS = ["a", "b", "c.d", "$priority", "$topic"]

# Few distinct values on both sides, so that boundaries (x = c for x >= c) are met often.
constants = st.one_of(
    st.integers(-2, 2).map(str),
    st.integers(-2, 2).map(str),
    st.sampled_from(["1.0", "2.5", "'1'", "'x'", "TRUE", "FALSE"]),
)
fields = st.sampled_from(FIELDS)


@st.composite
def atoms(draw: st.DrawFn) -> str:
    f = draw(fields)
    kind = draw(st.sampled_from(["cmp", "cmp", "cmp", "in", "between", "null", "like", "arith"]))
    if kind == "cmp":
        op = draw(st.sampled_from(["=", "=", "<>", "<", "<=", ">", ">="]))
        c = draw(constants)
        return f"{c} {op} {f}" if draw(st.booleans()) else f"{f} {op} {c}"
    if kind == "in":
        items = draw(st.lists(constants, min_size=1, max_size=3))
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{f} {neg}IN ({', '.join(items)})"
    if kind == "between":
        lo, hi = draw(st.integers(-2, 2)), draw(st.integers(-2, 2))
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{f} {neg}BETWEEN {lo} AND {hi}"
    if kind == "null":
        return f"{f} IS {'NOT ' if draw(st.booleans()) else ''}NULL"
    if kind == "like":
        return f"{f} LIKE '{draw(st.sampled_from(['x%', '1', '%', '_']))}'"
    return f"{f} + 1 > {draw(st.integers(-3, 3))}"


def expressions() -> st.SearchStrategy[str]:
    nested = st.recursive(
        atoms(),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(lambda p: f"({p[0]}) AND ({p[1]})"),
            st.tuples(inner, inner).map(lambda p: f"({p[0]}) OR ({p[1]})"),
            inner.map(lambda e: f"NOT ({e})"),
        ),
        max_leaves=3,
    )
    # A conjunction at the top, as most real filters are: that is what the index files.
    conjunct = st.one_of(atoms(), atoms(), nested)
    return st.lists(conjunct, min_size=1, max_size=3).map(" AND ".join)


xml_values = st.one_of(
    st.none(), st.integers(-3, 3).map(str), st.sampled_from(["x", "1.0", "true", ""])
)
json_values = st.one_of(
    st.none(),
    st.integers(-2, 2),
    st.integers(-2, 2),
    st.sampled_from([1.0, 2.5, -0.5]),
    st.booleans(),
    st.sampled_from(["x", "1", "y"]),
)


@st.composite
def messages(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    props = {
        "$priority": draw(st.integers(-2, 2)),
        "$topic": draw(st.sampled_from(["x", "y", "1"])),
    }
    el = etree.Element(f"{{{ns.WSNT}}}Message")
    if draw(st.booleans()):
        import json

        body = {k: v for k in ("a", "b") if (v := draw(json_values)) is not None}
        c = draw(json_values)
        if c is not None:
            body["c"] = {"d": c}
        el.text = json.dumps(body)
    else:
        # XML: the payload root is named after the first segment of each path.
        for name in ("a", "b"):
            v = draw(xml_values)
            if v is not None:
                etree.SubElement(el, name).text = v
        d = draw(xml_values)
        if d is not None:
            etree.SubElement(etree.SubElement(el, "c"), "d").text = d
    return message_of(el, properties=props)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    # Enough filters per example that every kind of conjunct meets values at its boundary.
    texts=st.lists(expressions(), min_size=10, max_size=40),
    msgs=st.lists(messages(), min_size=1, max_size=6),
)
def test_the_index_matches_exactly_what_linear_evaluation_matches(texts, msgs):
    filters = []
    for i, text in enumerate(texts):
        try:
            filters.append((i, compile_filter(text)))
        except FilterError:
            continue  # a type error (e.g. 'x' < TRUE) is refused at Subscribe, never indexed
    index = FilterIndex(filters)
    for m in msgs:
        assert sorted(index.matching(m)) == sorted(linear_matching(filters, m))


def test_equality_filters_are_met_through_the_index_only():
    filters = [(i, compile_filter("a = %0 AND b > 0", [i % 50])) for i in range(1000)]
    index = FilterIndex(filters)
    assert index.linear_share == 0
    el = etree.Element(f"{{{ns.WSNT}}}Message")
    el.text = '{"a": 7, "b": 1}'
    assert sorted(index.matching(message_of(el))) == [i for i in range(1000) if i % 50 == 7]


def test_an_xml_value_meets_filters_on_text_and_on_numbers_once_each():
    filters = [
        (0, compile_filter("a IN ('1', 1)")),
        (1, compile_filter("a = 1.0")),
        (2, compile_filter("a = '1.0'")),
    ]
    el = etree.Element(f"{{{ns.WSNT}}}Message")
    etree.SubElement(el, "a").text = "1"
    assert sorted(FilterIndex(filters).matching(message_of(el))) == [0, 1]


def test_xml_text_true_meets_a_filter_on_the_boolean_true():
    filters = [
        (0, compile_filter("a = TRUE")),
        (1, compile_filter("a = 'true'")),
        (2, compile_filter("a = FALSE")),
    ]
    el = etree.Element(f"{{{ns.WSNT}}}Message")
    etree.SubElement(el, "a").text = "true"
    assert sorted(FilterIndex(filters).matching(message_of(el))) == [0, 1]
