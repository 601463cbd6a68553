"""SQL-like filters of subscriptions: checked and compiled once, at Subscribe (SOAP or REST).

`subscription_filter_compile` is the one place a filter text and its parameters become a
CompiledFilter or a WSN fault; Subscribe calls it to refuse a bad filter before anything is
stored, the subscription index calls it again to build the filters it matches with. XPath
filters are not compiled here (subscriptions/services.py, subscriptions/selectors.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpwsn import errors, ns, sqlfilter
from hpwsn.sqlfilter import CompiledFilter, FilterError, Value

SQL = sqlfilter.DIALECT


def _fault(exc: FilterError, error: type[errors.WsnError], what: str) -> errors.WsnError:
    return error(
        f"{what} is not a valid SQL-like filter: {exc}",
        detail_xml=errors.filter_position_xml(exc.position, exc.expected),
        extensions={"position": exc.position, "expected": exc.expected},
    )


def subscription_filter_compile(
    *,
    content_text: str,
    content_dialect: str,
    producer_text: str,
    producer_dialect: str,
    parameters: Sequence[Value],
) -> CompiledFilter | None:
    """The subscription's SQL-like filter (MessageContent AND ProducerProperties), or None.

    Raises InvalidMessageContentExpression / InvalidProducerPropertiesExpression naming the
    column and what was expected there, or InvalidFilter for a dialect that is not supported.
    """
    content = producer = None
    if producer_text and producer_dialect != SQL:
        raise errors.InvalidFilter(
            f"ProducerProperties dialect '{producer_dialect or '(none)'}' is not supported;"
            f" use {SQL}",
            detail_xml=errors.unknown_filter_xml(ns.WSNT, "ProducerProperties"),
        )
    if content_dialect == SQL:
        try:
            content = sqlfilter.compile_filter(content_text, parameters)
        except FilterError as exc:
            raise _fault(exc, errors.InvalidMessageContentExpression, "MessageContent") from None
    if producer_text:
        try:
            producer = sqlfilter.compile_filter(producer_text, parameters, producer_only=True)
        except FilterError as exc:
            raise _fault(
                exc, errors.InvalidProducerPropertiesExpression, "ProducerProperties"
            ) from None
    if parameters and content is None and producer is None:
        raise errors.InvalidMessageContentExpression(
            "FilterParameters were given but no filter is in the SQL-like dialect "
            f"({SQL}) that could use them"
        )
    if content is not None and producer is not None:
        return sqlfilter.both(content, producer)
    return content or producer


def parameters_from_texts(texts: Sequence[str]) -> list[Value]:
    """hpwsn:FilterParameters as SOAP sends them (text) into values: 10, 'AAPL', TRUE."""
    return [sqlfilter.parameter_from_text(t) for t in texts]
