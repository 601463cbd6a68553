"""Termination times after year 9999 (UTC), which PostgreSQL stored before they were refused
(hpwsn.xsdtime): such a row made every read of its table fail, for every process. They become
the last instant of year 9999, which is the "never" the client asked for. Other databases could
not store them (Django converts to UTC in Python there, which fails first)."""

from django.db import migrations

LAST = "9999-12-31 23:59:59+00"
TABLES = ("subscriptions_subscription", "subscriptions_publisherregistration")


def within_year_9999(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(
                f"UPDATE {table} SET termination_time = %s WHERE termination_time > %s",
                [LAST, LAST],
            )


class Migration(migrations.Migration):
    dependencies = [
        ("subscriptions", "0013_created_from"),
    ]

    operations = [
        migrations.RunPython(within_year_9999, migrations.RunPython.noop, elidable=True),
    ]
