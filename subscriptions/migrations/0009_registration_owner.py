from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("subscriptions", "0008_subscription_format"),
    ]

    operations = [
        migrations.AddField(
            model_name="publisherregistration",
            name="owner",
            field=models.CharField(db_index=True, default="anonymous", max_length=300),
        ),
    ]
