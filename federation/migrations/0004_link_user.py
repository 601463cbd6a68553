from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("federation", "0003_link_producer_filter"),
    ]

    operations = [
        migrations.AddField(
            model_name="link",
            name="user",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
    ]
