"""The compile step Subscribe and a REST edge share: faults carry the position for both edges."""

import pytest

from hpwsn import errors
from hpwsn.sqlfilter import DIALECT
from subscriptions.filters import parameters_from_texts, subscription_filter_compile


def compile_(text: str, params=(), producer: str = ""):  # type: ignore[no-untyped-def]
    return subscription_filter_compile(
        content_text=text,
        content_dialect=DIALECT if text else "",
        producer_text=producer,
        producer_dialect=DIALECT if producer else "",
        parameters=params,
    )


def test_a_syntax_error_carries_position_and_expectations_for_soap_and_json():
    with pytest.raises(errors.InvalidMessageContentExpression) as caught:
        compile_("a = ")
    assert caught.value.extensions["position"] == 5
    assert "a number" in caught.value.extensions["expected"]  # type: ignore[operator]
    assert "<hpwsn:Position" in caught.value.detail_xml


def test_content_and_producer_filters_must_both_hold():
    from hpwsn.sqlfilter import message_of

    f = compile_("a = %0", [1], producer="$priority > 3")
    assert f is not None
    assert f(message_of(json_body={"a": 1}, properties={"$priority": 4}))
    assert not f(message_of(json_body={"a": 1}, properties={"$priority": 2}))
    assert not f(message_of(json_body={"a": 2}, properties={"$priority": 4}))


def test_an_xpath_filter_is_not_compiled_here():
    assert (
        subscription_filter_compile(
            content_text="//a",
            content_dialect="http://www.w3.org/TR/1999/REC-xpath-19991116",
            producer_text="",
            producer_dialect="",
            parameters=(),
        )
        is None
    )


def test_parameters_given_as_json_values_keep_their_types():
    from hpwsn.sqlfilter import message_of

    f = compile_("code = %0", ["7"])  # a JSON string stays a string
    assert f is not None
    assert f(message_of(json_body={"code": "7"}))
    assert not f(message_of(json_body={"code": 7}))
    assert parameters_from_texts(["7", "'7'"]) == [7, "7"]  # SOAP text is read as a literal
