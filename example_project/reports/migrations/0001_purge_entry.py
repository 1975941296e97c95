"""A database-only schedule entry, created once by this data migration.

Edit, disable or delete it in the admin (Periodic tasks): the leading beat
follows within django-celery-beat's refresh time (5 s).
"""

from django.db import migrations


def create_entry(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every_minute, _ = IntervalSchedule.objects.get_or_create(every=1, period="minutes")
    PeriodicTask.objects.get_or_create(
        name="purge-old-reports",
        defaults={"task": "reports.tasks.purge_old_reports", "interval": every_minute},
    )


def delete_entry(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name="purge-old-reports").delete()


class Migration(migrations.Migration):
    dependencies = (("django_celery_beat", "0018_improve_crontab_helptext"),)
    operations = (migrations.RunPython(create_entry, delete_entry),)
