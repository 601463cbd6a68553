from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("topics", "0004_require_registration"),
    ]

    operations = [
        migrations.CreateModel(
            name="Change",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=[("topic", "Topic"), ("sub", "Subscription")], max_length=8
                    ),
                ),
                ("key", models.CharField(max_length=1024)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
