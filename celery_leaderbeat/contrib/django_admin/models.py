"""No table: one unmanaged model that carries the view's permissions.

``view_cluster`` (Django's own) lets a staff user see the pages; each action has a
permission of its own, granted like any other (a group "operators" with pause and
resume, say, but not step-down)."""

from django.db import models

#: the permission each action needs (``leaderbeat_admin.<codename>``)
ACTION_PERMISSIONS = {"pause": "pause_entry", "resume": "resume_entry",
                      "trigger": "trigger_entry", "backfill": "backfill_entry",
                      "step-down": "step_down_leader"}


class Cluster(models.Model):
    class Meta:
        managed = False
        verbose_name = "cluster"
        verbose_name_plural = "cluster"
        default_permissions = ("view",)
        permissions = (
            ("pause_entry", "Can pause an entry"),
            ("resume_entry", "Can resume an entry"),
            ("trigger_entry", "Can trigger an entry"),
            ("backfill_entry", "Can backfill an entry's slots"),
            ("step_down_leader", "Can make the leader step down"),
        )
