from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("federation", "0002_interest_path"),
    ]

    operations = [
        migrations.AddField(
            model_name="link",
            name="producer_filter",
            field=models.TextField(blank=True, default=""),
        ),
    ]
