"""Other schedulers and the workers: the gate (django-celery-beat and any base scheduler) and the worker guard."""
