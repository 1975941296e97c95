from django.apps import AppConfig


class LeaderbeatAdminConfig(AppConfig):
    name = "celery_leaderbeat.contrib.django_admin"
    label = "leaderbeat_admin"
    verbose_name = "Leaderbeat"
    default_auto_field = "django.db.models.AutoField"
