from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: tuple[tuple[str, str], ...] = ()

    operations = (
        migrations.CreateModel(
            name="Cluster",
            fields=[("id", models.AutoField(auto_created=True, primary_key=True,
                                            serialize=False, verbose_name="ID"))],
            options={
                "verbose_name": "cluster",
                "verbose_name_plural": "cluster",
                "managed": False,
                "default_permissions": ("view",),
                "permissions": (
                    ("pause_entry", "Can pause an entry"),
                    ("resume_entry", "Can resume an entry"),
                    ("trigger_entry", "Can trigger an entry"),
                    ("backfill_entry", "Can backfill an entry's slots"),
                    ("step_down_leader", "Can make the leader step down"),
                ),
            },
        ),
    )
