"""The Scheduler's mixins; wrapping another scheduler (django-celery-beat, any base); the
worker guard."""
