"""Redis keys and Channels groups of the analytics app."""

PREFIX = "hpwsn:analytics:"
LEASE = PREFIX + "lease"  # the run holding Spark now: one run at a time per broker


def progress_key(run_id: str) -> str:
    """The run's latest progress (JSON), for a page that connects mid-run."""
    return f"{PREFIX}progress:{run_id}"


def group(run_id: str) -> str:
    """Channels group of the pages watching one run."""
    return f"analytics.run.{run_id}"
