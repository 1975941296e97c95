"""The web view's pages inside Django's admin, with Django's sign-in, CSRF and permissions.

The same markup as the standalone view (:mod:`celery_leaderbeat.web.pages`), framed by
the admin's own page; pages need ``leaderbeat_admin.view_cluster``, each action its
own permission (:data:`~.models.ACTION_PERMISSIONS`); every action writes an ``audit``
event naming the user.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.middleware.csrf import get_token
from django.template import engines
from django.urls import path, reverse
from django.utils.module_loading import import_string
from django.views.decorators.http import require_POST

from ...errors import EntryNotFound
from ...ops.cluster import Cluster as StoreCluster
from ...web import assets, pages
from ...web.actions import ACTIONS, ActionRefused, Operator, run
from ...web.model import ClusterView
from ...web.wsgi import POLL_MS, HTTPError, parts
from .models import ACTION_PERMISSIONS, Cluster

#: the admin's frame around a page; ``body`` is HTML the view's pages escaped already
PAGE = """{% extends "admin/base_site.html" %}
{% block extrastyle %}{{ block.super }}
<link rel="stylesheet" href="{{ base }}static/web.css">
<script src="{{ base }}static/web.js" defer></script>{% endblock %}
{% block breadcrumbs %}<div class="breadcrumbs"><a href="{% url 'admin:index' %}">Home</a>
&rsaquo; <a href="{% url 'admin:app_list' 'leaderbeat_admin' %}">Leaderbeat</a>
&rsaquo; {{ title }}</div>{% endblock %}
{% block content %}<p class="leaderbeat-nav"><a href="{{ base }}">Cluster</a> &middot;
<a href="{{ base }}entries/">Entries</a> &middot; <a href="{{ base }}history/">History</a>
{% if dcb %} &middot; <a href="{{ dcb }}">Periodic tasks (django-celery-beat)</a>{% endif %}</p>
<div data-live="{{ live_url }}" data-every="{{ every }}">{{ body|safe }}</div>{% endblock %}
"""

_view: ClusterView | None = None
_view_lock = threading.Lock()


def cluster_view() -> ClusterView:
    """One view per process, on the Celery app ``LEADERBEAT_ADMIN_CELERY_APP`` names, or
    ``celery.current_app``."""
    global _view
    with _view_lock:
        if _view is None:
            from celery import current_app

            named = getattr(settings, "LEADERBEAT_ADMIN_CELERY_APP", None)
            app = import_string(named.replace(":", ".")) if named else current_app
            # the definitions are rebuilt in a thread of their own, which reads
            # django-celery-beat's table: its connection is closed when it is done
            _view = ClusterView(StoreCluster(app), after_rebuild=connections.close_all)
        return _view


class AdminLinks:
    """The admin's URLs for the view's pages, under the model's changelist."""

    def __init__(self, base: str) -> None:
        self.base = base

    def cluster(self) -> str:
        return self.base

    def entries(self, **params: Any) -> str:
        return self.base + "entries/" + pages.query_string(**params)

    def entry(self, name: str) -> str:
        return f"{self.base}entries/{quote(name, safe='')}/"

    def history(self) -> str:
        return self.base + "history/"

    def action(self, action: str) -> str:
        return f"{self.base}actions/{action}/"


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    """No rows to add or change: the changelist is the cluster page."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        wrap, info = self.admin_site.admin_view, self.opts.app_label
        return [
            path("", wrap(self.page_view), {"kind": "cluster"},
                 name=f"{info}_cluster_changelist"),
            path("entries/", wrap(self.page_view), {"kind": "entries"},
                 name=f"{info}_cluster_entries"),
            path("history/", wrap(self.page_view), {"kind": "history"},
                 name=f"{info}_cluster_history"),
            path("entries/<path:name>/", wrap(self.page_view), {"kind": "entry"},
                 name=f"{info}_cluster_entry"),
            path("actions/<str:action>/", wrap(require_POST(self.action_view)),
                 name=f"{info}_cluster_action"),
            path("static/<str:asset>", wrap(self.asset_view), name=f"{info}_cluster_asset"),
        ]

    def _base(self) -> str:
        return str(reverse(f"{self.admin_site.name}:leaderbeat_admin_cluster_changelist"))

    def _viewer(self, request: HttpRequest) -> pages.Viewer:
        def may(action: str) -> bool:
            return bool(request.user.has_perm(f"leaderbeat_admin.{ACTION_PERMISSIONS[action]}"))
        return pages.Viewer(may, "csrfmiddlewaretoken", get_token(request),
                            request.user.get_username())

    def page_view(self, request: HttpRequest, kind: str, name: str = "") -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        base, query = self._base(), dict(request.GET.items())
        try:
            title, content, above, below = parts(cluster_view(), kind, name, query,
                                                 AdminLinks(base), self._viewer(request))
        except HTTPError as exc:
            if exc.status == 404:
                raise Http404(exc.message) from None
            return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
        if query.get("_live"):
            return HttpResponse(content)
        live = request.path + pages.query_string(**{**query, "_live": "1"})
        body = pages.message(query.get("done", "")) + above + pages.live(content) + below
        context = {**self.admin_site.each_context(request), "title": title, "base": base,
                   "body": body, "live_url": live, "every": POLL_MS[kind], "dcb": _dcb()}
        return HttpResponse(engines["django"].from_string(PAGE).render(context, request))

    def action_view(self, request: HttpRequest, action: str) -> HttpResponse:
        if action not in ACTIONS:
            raise Http404(f"no action {action!r}: one of {', '.join(ACTIONS)}")
        if not request.user.has_perm(f"leaderbeat_admin.{ACTION_PERMISSIONS[action]}"):
            raise PermissionDenied(f"{action} needs leaderbeat_admin."
                                   f"{ACTION_PERMISSIONS[action]}")
        form = {k: v for k, v in request.POST.items() if k != "csrfmiddlewaretoken"}
        operator = Operator(request.user.get_username(), "django-admin")
        try:
            answer = run(cluster_view().cluster, operator, action, form)
        except EntryNotFound as exc:
            raise Http404(str(exc)) from None
        except ActionRefused as exc:
            return JsonResponse({"error": {"status": exc.status, "message": str(exc)}},
                                status=exc.status)
        if request.headers.get("Accept", "").startswith("application/json"):
            return JsonResponse(answer)
        links = AdminLinks(self._base())
        back = links.cluster() if action == "step-down" else links.entry(form["name"])
        return HttpResponseRedirect(back + pages.query_string(done=action))

    def asset_view(self, request: HttpRequest, asset: str) -> HttpResponse:
        if asset == "web.js":
            return HttpResponse(assets.SCRIPT, content_type="text/javascript")
        if asset == "web.css":
            return HttpResponse(assets.STYLE, content_type="text/css")
        raise Http404(asset)


def _dcb() -> str | None:
    """django-celery-beat's periodic tasks in this admin, when it is installed."""
    try:
        return str(reverse("admin:django_celery_beat_periodictask_changelist"))
    except Exception:  # noqa: BLE001 - not installed, or not in this admin site
        return None
