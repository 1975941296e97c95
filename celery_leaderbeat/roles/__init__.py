"""The two roles, leader and standby, and what they share: the store and the Celery side
(``shared``, ``port``), the agenda, claiming and sending."""
