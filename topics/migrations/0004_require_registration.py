from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("topics", "0003_acl_policy"),
    ]

    operations = [
        migrations.AddField(
            model_name="topic",
            name="require_registration",
            field=models.BooleanField(
                blank=True,
                help_text="only publishers registered with RegisterPublisher for the topic may publish",
                null=True,
            ),
        ),
    ]
