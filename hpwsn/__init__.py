"""HPwsn wire codec, topic expressions and client library. Imports nothing from Django."""

__version__ = "0.1.0"
