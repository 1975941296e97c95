"""The example's tasks: beat only enqueues them; a worker runs them."""

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task
def say_hello() -> str:
    logger.info("hello from the example project")
    return "hello"


@shared_task
def build_report(kind: str) -> str:
    logger.info("building the %s report", kind)
    return kind


@shared_task
def purge_old_reports() -> int:
    logger.info("purging old reports")
    return 0
