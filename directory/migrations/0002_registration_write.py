from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("directory", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="RegistrationWrite",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("version", models.PositiveIntegerField(default=1)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("next_try_at", models.DateTimeField(db_index=True)),
                ("last_error", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("registration_id", models.UUIDField(unique=True)),
            ],
            options={
                "ordering": ["next_try_at"],
                "abstract": False,
            },
        ),
    ]
