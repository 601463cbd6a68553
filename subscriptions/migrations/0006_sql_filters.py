from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("subscriptions", "0005_owner"),
    ]

    operations = [
        migrations.AddField(
            model_name="subscription",
            name="filter_parameters",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="subscription",
            name="producer_filter",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="subscription",
            name="producer_dialect",
            field=models.CharField(blank=True, default="", max_length=256),
        ),
    ]
