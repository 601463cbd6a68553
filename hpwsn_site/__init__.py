from hpwsn_site.allocator import arenas_limit

arenas_limit()  # before any thread starts (hpwsn_site/allocator.py)

from hpwsn_site.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
