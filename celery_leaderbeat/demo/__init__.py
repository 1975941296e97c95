"""The one-command failover demo: ``python -m celery_leaderbeat.demo``."""
