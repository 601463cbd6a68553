import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hpwsn_site.settings")

django_application = get_asgi_application()

from hpwsn_site.fastpath import wrap  # noqa: E402 - needs the settings configured above

application = wrap(django_application)
