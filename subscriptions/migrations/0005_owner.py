from django.db import migrations, models


class Migration(migrations.Migration):
    """Subscriptions and pull points belong to the principal that created them.

    Rows made before this are owned by "anonymous": whoever holds their reference may still act
    on them, as before. Their dedup keys need no change (subscription_dedup_key gives an
    anonymous owner the key it gave before owners existed).
    """

    dependencies = [
        ("subscriptions", "0004_pull_point_last_used"),
    ]

    operations = [
        migrations.AddField(
            model_name="pullpoint",
            name="owner",
            field=models.CharField(db_index=True, default="anonymous", max_length=300),
        ),
        migrations.AddField(
            model_name="subscription",
            name="owner",
            field=models.CharField(db_index=True, default="anonymous", max_length=300),
        ),
    ]
