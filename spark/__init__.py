"""Analytics: the event log's format, the PySpark jobs over it, and the runner that records runs."""
