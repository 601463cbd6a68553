"""XML namespaces and WS-Addressing actions used on the wire."""

SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"
WSA_ANONYMOUS = "http://www.w3.org/2005/08/addressing/anonymous"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSNBR = "http://docs.oasis-open.org/wsn/br-2"
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
WSRF_BF = "http://docs.oasis-open.org/wsrf/bf-2"
WSRF_R = "http://docs.oasis-open.org/wsrf/r-2"
WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
LEGACY = "http://org.apache.servicemix.application"
HPWSN = "urn:hpwsn:2026"

DIALECT_SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
DIALECT_CONCRETE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
DIALECT_FULL = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
# The thesis's colon paths (ALL:ALARM:ALARM1) as a dialect of their own.
DIALECT_COLON = "urn:hpwsn:topic-dialect:colon-path"
TOPIC_DIALECTS = (DIALECT_SIMPLE, DIALECT_CONCRETE, DIALECT_FULL, DIALECT_COLON)

FILTER_XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"

BW = "http://docs.oasis-open.org/wsn/bw-2"
BRW = "http://docs.oasis-open.org/wsn/brw-2"
RW = "http://docs.oasis-open.org/wsrf/rw-2"

ACTION_NOTIFY = f"{BW}/NotificationConsumer/Notify"


def action(port_type: str, operation: str, *, response: bool = False, base: str = BW) -> str:
    """The WS-Addressing default action of a WSN operation (WSN 1.3 WSDLs)."""
    return f"{base}/{port_type}/{operation}{'Response' if response else 'Request'}"
