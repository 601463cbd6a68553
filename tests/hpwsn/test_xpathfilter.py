"""The static checks of MessageContent filters (hpwsn/xpathfilter.py)."""

from __future__ import annotations

import pytest
from lxml import etree

from hpwsn.xpathfilter import FilterRejected, compile_filter

RE = {"re": "http://exslt.org/regular-expressions"}
MESSAGE = etree.fromstring("<m><t:temp xmlns:t='urn:t' unit='C'>31</t:temp><a><b/></a></m>")


@pytest.mark.parametrize(
    ("expr", "nsmap", "cost"),
    [
        ("re:test(., '(')", RE, False),
        ("re:match(., '(a+)+$')", RE, False),
        ("str:padding(1000000000, 'x') = ''", {"str": "http://exslt.org/strings"}, False),
        ("count(//*[count(following::*[count(preceding::*) > 0]) > 0]) > 0", {}, True),
        ("//a[preceding::b]", {}, True),
        ("//a[following-sibling::b]", {}, True),
        ("//a[//b]", {}, True),
        ("//a[. = /m/b]", {}, True),
        ("//a[. = 'x' or //b]", {}, True),
        ("//a[not(//b)]", {}, True),
        ("//a[count(../*) > 1]", {}, True),
        ("//a[parent::*/b]", {}, True),
        ("//a[.//b[.//c]]", {}, True),
        ("//a[descendant::b[ancestor::c]]", {}, True),
        ("$x", {}, False),
        ("unknown() = 1", {}, False),
        ("//a[", {}, False),
        ("x" * 1025, {}, True),
    ],
)
def test_it_refuses_extensions_variables_and_expressions_that_can_go_quadratic(expr, nsmap, cost):
    with pytest.raises(FilterRejected) as refused:
        compile_filter(expr, nsmap, max_chars=1024)
    assert refused.value.cost is cost


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("boolean(//t:temp[. > 30])", True),
        ("//t:temp[@unit = 'F']", []),
        ("count(//*) = 4 and not(//c)", True),
        ("//a[.//b] and //a[b][not(c)]", True),
        ("//b[../@x or not(..)]", []),
        ("count(../m) = 1", True),
        ("contains(normalize-space(string(.)), '31')", True),
        ("//*[local-name() = 'temp' and namespace-uri() = 'urn:t']/@unit = 'C'", True),
    ],
)
def test_it_compiles_ordinary_filters_that_evaluate_as_before(expr, expected):
    result = compile_filter(expr, {"t": "urn:t"}, max_chars=1024)(MESSAGE)
    assert result == expected


def test_regular_expressions_are_not_even_reachable_when_the_prefix_is_bound():
    evaluate = compile_filter("true()", RE, max_chars=1024)
    assert evaluate(MESSAGE) is True
    with pytest.raises(etree.XPathEvalError):
        etree.XPath("re:test(., 'x')", namespaces=RE, regexp=False)(MESSAGE)
