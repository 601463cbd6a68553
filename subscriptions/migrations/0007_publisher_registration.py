import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("subscriptions", "0006_sql_filters"),
    ]

    operations = [
        migrations.CreateModel(
            name="PublisherRegistration",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("reference_address", models.CharField(blank=True, default="", max_length=2048)),
                ("publisher_address", models.CharField(db_index=True, max_length=2048)),
                ("topic_paths", models.JSONField(blank=True, default=list)),
                ("termination_time", models.DateTimeField(blank=True, db_index=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("demand", models.BooleanField(default=False)),
                ("broker_address", models.CharField(blank=True, default="", max_length=2048)),
                ("demand_state", models.JSONField(blank=True, default=dict)),
            ],
            options={"ordering": ["created_at"]},
        ),
    ]
