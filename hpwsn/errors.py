"""Broker errors named after the WSN faults they become (REST maps them to HTTP problems)."""

from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import escape, quoteattr

from hpwsn import ns, topicexpr


class WsnError(Exception):
    fault = "SoapClientFault"  # the WSN fault element name; empty for a plain SOAP Client fault
    namespace = ns.WSNT
    http_status = 400

    def __init__(
        self, message: str, *, detail_xml: str = "", extensions: dict[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail_xml = detail_xml  # fault-specific elements after wsrf-bf:Description
        # The same facts for a JSON edge (RFC 9457 extension members), e.g. a filter's position.
        self.extensions = extensions or {}


class InvalidTopicExpression(WsnError):
    fault = "InvalidTopicExpressionFault"


class TopicExpressionDialectUnknown(WsnError):
    fault = "TopicExpressionDialectUnknownFault"


class TopicNotSupported(WsnError):
    fault = "TopicNotSupportedFault"
    http_status = 404


class InvalidFilter(WsnError):
    fault = "InvalidFilterFault"


class InvalidMessageContentExpression(WsnError):
    fault = "InvalidMessageContentExpressionFault"


class InvalidProducerPropertiesExpression(WsnError):
    fault = "InvalidProducerPropertiesExpressionFault"


def filter_position_xml(position: int, expected: list[str]) -> str:
    """Where a filter went wrong and what was expected there (after the fault's Description)."""
    x = f'xmlns:hpwsn="{ns.HPWSN}"'
    wanted = "".join(f"<hpwsn:Expected {x}>{escape(e)}</hpwsn:Expected>" for e in expected)
    return f"<hpwsn:Position {x}>{position}</hpwsn:Position>{wanted}"


class PublisherRegistrationRejected(WsnError):
    """A registration refused, or a Notify from a publisher not registered (WS-Brokered)."""

    fault = "PublisherRegistrationRejectedFault"
    namespace = ns.WSNBR
    http_status = 403


class UnacceptableInitialTerminationTime(WsnError):
    fault = "UnacceptableInitialTerminationTimeFault"


class UnacceptableTerminationTime(WsnError):
    fault = "UnacceptableTerminationTimeFault"


class ResourceUnknown(WsnError):
    fault = "ResourceUnknownFault"
    namespace = ns.WSRF_R
    http_status = 404


class UnableToCreatePullPoint(WsnError):
    fault = "UnableToCreatePullPointFault"
    http_status = 403


class UnableToDestroyPullPoint(WsnError):
    fault = "UnableToDestroyPullPointFault"
    http_status = 409


class NoCurrentMessageOnTopic(WsnError):
    fault = "NoCurrentMessageOnTopicFault"
    http_status = 404


def minimum_time_xml(when: str) -> str:
    """The wsnt:MinimumTime an Unacceptable*TerminationTimeFault must carry."""
    return f'<wsnt:MinimumTime xmlns:wsnt="{ns.WSNT}">{when}</wsnt:MinimumTime>'


def unknown_filter_xml(namespace: str | None, local: str) -> str:
    """The wsnt:UnknownFilter QName an InvalidFilterFault must carry."""
    return (
        f'<wsnt:UnknownFilter xmlns:wsnt="{ns.WSNT}" xmlns:uf={quoteattr(namespace)}>uf:{local}'
        "</wsnt:UnknownFilter>"
        if namespace
        else f'<wsnt:UnknownFilter xmlns:wsnt="{ns.WSNT}">{local}</wsnt:UnknownFilter>'
    )


class InvalidConsumerReference(WsnError):
    """The consumer address is not an http(s) URL the broker can push to (plain Client fault)."""

    fault = ""


class SubscribeCreationFailed(WsnError):
    fault = "SubscribeCreationFailedFault"
    http_status = 403


class UnsupportedPolicy(WsnError):
    fault = "UnsupportedPolicyRequestFault"


class InvalidSubscriptionPolicy(WsnError):
    """A supported policy with a value that cannot be used (plain Client fault naming it)."""

    fault = ""


class InvalidFragment(WsnError):
    """A fragment that cannot be held or reassembled (plain Client fault that names the problem)."""

    fault = ""


class NotAuthorized(WsnError):
    """The caller may not do this on this topic (a Sender fault with hpwsn:NotAuthorized)."""

    fault = "NotAuthorized"
    namespace = ns.HPWSN
    http_status = 403


def not_authorized_xml(
    principal: str | None, operation: str, topic: str, *, element: str = "Topic"
) -> str:
    """Who was refused what on which topic (or, element="Resource", on which subscription or pull
    point address): the elements after NotAuthorized's Description."""
    x = f'xmlns:hpwsn="{ns.HPWSN}"'
    who = (
        f'<hpwsn:Principal {x} anonymous="true"/>'
        if principal is None
        else f"<hpwsn:Principal {x}>{escape(principal)}</hpwsn:Principal>"
    )
    return (
        f"{who}<hpwsn:Operation {x}>{operation}</hpwsn:Operation>"
        f"<hpwsn:{element} {x}>{escape(topic)}</hpwsn:{element}>"
    )


def topic_expression_parse(
    text: str, dialect: str | None, nsmap: Mapping[str, str]
) -> topicexpr.TopicExpression:
    """A topic expression, or the WSN fault its text deserves (unknown dialect, invalid)."""
    try:
        return topicexpr.parse(text, dialect, nsmap)
    except topicexpr.UnknownDialectError as exc:
        raise TopicExpressionDialectUnknown(str(exc)) from None
    except topicexpr.TopicExpressionError as exc:
        raise InvalidTopicExpression(str(exc)) from None
