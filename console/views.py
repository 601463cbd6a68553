"""The operators' console: thin views over the topic, subscription and audit services."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST
from redis.exceptions import RedisError

from audit.selectors import audit_actors, audit_entries, topic_audit_entries
from console import forms, selectors
from console import services as console_services
from console.roles import can_change, can_view, role_label
from dispatch.selectors import dead_letters
from federation.selectors import peers_status
from hpwsn import errors
from subscriptions import cascades
from subscriptions.models import Subscription
from topics import services as topic_services
from topics.models import Topic
from topics.selectors import POLICY_FIELDS, topic_tree

View = Callable[..., HttpResponse]
PAGE = 100


def console_view(*, write: bool = False) -> Callable[[View], View]:
    """Login required; any console role may read, operators and admins may change."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path(), reverse("console:login"))
            if not can_view(request.user) or (write and not can_change(request.user)):
                return _forbidden(request)
            try:
                return view(request, *args, **kwargs)
            except PermissionDenied:
                return _forbidden(request)

        return wrapper

    return decorate


def _forbidden(request: HttpRequest) -> HttpResponse:
    return render(request, "console/forbidden.html", _ctx(request), status=403)


def _ctx(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {
        "role": role_label(request.user),
        "can_change": can_change(request.user),
        **extra,
    }


# ----------------------------------------------------------------------------- topics


@console_view()
@require_http_methods(["GET"])
def tree(request: HttpRequest) -> HttpResponse:
    view = selectors.topic_tree_view()
    # One prefix rather than a {% url %} per node: the tree may have thousands.
    topic_base = reverse("console:tree") + "topics/"
    subs_base = reverse("console:subscriptions") + "?topic="
    ctx = _ctx(request, tree=view, section="topics", topic_base=topic_base, subs_base=subs_base)
    return render(request, "console/tree.html", ctx)


@console_view(write=True)
@require_http_methods(["GET", "POST"])
def topic_create(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = forms.CreateTopicForm(request.POST)
        if form.is_valid():
            path = form.cleaned_data["path"].strip()
            if Topic.objects.filter(path=path).exists():
                form.add_error("path", f"a topic '{path}' already exists")
            else:
                try:
                    topic = topic_services.topic_create(
                        path=path,
                        namespace=form.cleaned_data["namespace"],
                        description=form.cleaned_data["description"],
                        actor=request.user,
                    )
                except ValueError as exc:
                    form.add_error("path", str(exc))
                else:
                    messages.success(request, f"Topic {topic.path} created.")
                    return redirect("console:topic", pk=topic.pk)
    else:
        form = forms.CreateTopicForm(initial={"path": request.GET.get("parent", "")})
    return render(request, "console/topic_create.html", _ctx(request, form=form, section="topics"))


def _topic_page(
    request: HttpRequest,
    topic: Topic,
    *,
    policy_form: forms.PolicyForm | None = None,
    rename_form: forms.RenameForm | None = None,
    move_form: forms.MoveForm | None = None,
    status: int = 200,
) -> HttpResponse:
    fields = POLICY_FIELDS
    inherited = selectors.inherited_policy(topic=topic)
    node = topic_tree(max_age=0).get(topic.path)
    effective = (
        {f: selectors.policy_display(f, getattr(node.policy, f, None)) for f in fields}
        if node
        else {}
    )
    ctx = _ctx(
        request,
        section="topics",
        topic=topic,
        ancestors=[t for t in Topic.objects.filter(path__in=_ancestor_paths(topic.path))],
        children=topic.children.order_by("name"),
        policy_form=policy_form
        or forms.PolicyForm(topic=topic, fields=fields, inherited=inherited),
        rename_form=rename_form or forms.RenameForm(initial={"name": topic.name}),
        move_form=move_form or forms.MoveForm(initial={"parent": topic.path.rpartition(":")[0]}),
        parent_choices=selectors.topic_paths(exclude_subtree_of=topic),
        effective=effective,
        subscriptions=selectors.subtree_subscriptions(path=topic.path).count(),
        recent_audit=topic_audit_entries(topic_id=topic.pk)[:10],
    )
    return render(request, "console/topic.html", ctx, status=status)


def _ancestor_paths(path: str) -> list[str]:
    names = path.split(":")
    return [":".join(names[:k]) for k in range(1, len(names))]


@console_view()
@require_http_methods(["GET", "POST"])
def topic_detail(request: HttpRequest, pk: int) -> HttpResponse:
    topic = get_object_or_404(Topic, pk=pk)
    if request.method != "POST":
        return _topic_page(request, topic)
    if not can_change(request.user):
        raise PermissionDenied
    fields = POLICY_FIELDS
    inherited = selectors.inherited_policy(topic=topic)
    form = forms.PolicyForm(request.POST, topic=topic, fields=fields, inherited=inherited)
    if form.is_valid():
        try:
            topic_services.topic_update(
                topic_id=topic.pk, changes=form.changes(), actor=request.user
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            messages.success(request, f"Policy of {topic.path} saved.")
            return redirect("console:topic", pk=topic.pk)
    return _topic_page(request, topic, policy_form=form, status=400)


@console_view(write=True)
@require_POST
def topic_rename(request: HttpRequest, pk: int) -> HttpResponse:
    topic = get_object_or_404(Topic, pk=pk)
    form = forms.RenameForm(request.POST)
    if form.is_valid():
        old = topic.path
        try:
            topic = cascades.topic_rename(
                topic_id=topic.pk, name=form.cleaned_data["name"], actor=request.user
            )
        except ValidationError as exc:
            form.add_error("name", exc.messages)
        else:
            messages.success(request, f"{old} renamed to {topic.path}.")
            return redirect("console:topic", pk=topic.pk)
    return _topic_page(request, topic, rename_form=form, status=400)


@console_view(write=True)
@require_POST
def topic_move(request: HttpRequest, pk: int) -> HttpResponse:
    topic = get_object_or_404(Topic, pk=pk)
    form = forms.MoveForm(request.POST)
    if form.is_valid():
        old = topic.path
        parent = form.cleaned_data["parent"]
        try:
            topic = cascades.topic_move(
                topic_id=topic.pk, parent_id=parent.pk if parent else None, actor=request.user
            )
        except ValidationError as exc:
            form.add_error("parent", exc.messages)
        else:
            messages.success(request, f"{old} moved to {topic.path}.")
            return redirect("console:topic", pk=topic.pk)
    return _topic_page(request, topic, move_form=form, status=400)


@console_view(write=True)
@require_http_methods(["GET", "POST"])
def topic_delete(request: HttpRequest, pk: int) -> HttpResponse:
    topic = get_object_or_404(Topic, pk=pk)
    form = forms.DeleteTopicForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        path = topic.path
        result = cascades.topic_delete(
            topic_id=topic.pk, subscriptions=form.cleaned_data["subscriptions"], actor=request.user
        )
        messages.success(
            request,
            f"Deleted {path} ({result.topics} topic(s)); subscriptions unsubscribed: "
            f"{result.subscriptions_deleted}, kept: {result.subscriptions_kept}.",
        )
        return redirect("console:tree")
    ctx = _ctx(
        request,
        section="topics",
        topic=topic,
        form=form,
        topic_count=selectors.subtree_topic_count(path=topic.path),
        subscriptions=selectors.subtree_subscriptions(path=topic.path)[:50],
        subscription_count=selectors.subtree_subscriptions(path=topic.path).count(),
    )
    return render(request, "console/topic_delete.html", ctx)


# ----------------------------------------------------------------------------- subscriptions


@console_view()
@require_http_methods(["GET"])
def subscription_list(request: HttpRequest) -> HttpResponse:
    filters = {
        "query": request.GET.get("q", ""),
        "state_name": request.GET.get("state", ""),
        "mode": request.GET.get("mode", ""),
        "topic": request.GET.get("topic", ""),
    }
    page = Paginator(
        selectors.subscriptions_filtered(**filters, reveal=can_change(request.user)), PAGE
    ).get_page(request.GET.get("page"))
    ctx = _ctx(
        request,
        section="subscriptions",
        page=page,
        rows=selectors.subscription_rows(subs=page.object_list),
        filters=filters,
        states=Subscription.State.choices,
        modes=Subscription.Mode.choices,
        renew_form=forms.RenewForm(),
    )
    return render(request, "console/subscriptions.html", ctx)


def _back(request: HttpRequest, default: str) -> HttpResponse:
    target = request.POST.get("next", "")
    # Only a page of this site: never an address someone slipped into the form.
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(target)
    return redirect(default)


@console_view(write=True)
@require_POST
def subscription_action(request: HttpRequest, sub_id: str, action: str) -> HttpResponse:
    sid = str(sub_id)
    try:
        if action in ("pause", "resume"):
            console_services.subscription_pause_or_resume(
                subscription_id=sid, paused=action == "pause", actor=request.user
            )
        elif action == "renew":
            form = forms.RenewForm(request.POST)
            if not form.is_valid():
                raise errors.UnacceptableTerminationTime("a termination time is required")
            console_services.subscription_renew_by_operator(
                subscription_id=sid,
                termination_time=form.cleaned_data["termination_time"],
                actor=request.user,
            )
        elif action == "remove":
            console_services.subscription_remove(subscription_id=sid, actor=request.user)
        else:
            raise Http404(f"unknown action '{action}'")
    except errors.WsnError as exc:
        messages.error(request, f"{action} {sid}: {exc.message}")
    else:
        messages.success(request, f"Subscription {sid}: {action} done.")
    return _back(request, reverse("console:subscriptions"))


@console_view()
@require_http_methods(["GET"])
def pull_point_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    ctx = _ctx(
        request,
        section="pullpoints",
        rows=selectors.pull_point_rows(query=query, reveal=can_change(request.user)),
        query=query,
    )
    return render(request, "console/pullpoints.html", ctx)


@console_view(write=True)
@require_POST
def pull_point_remove(request: HttpRequest, pp_id: str) -> HttpResponse:
    try:
        console_services.pull_point_remove(pull_point_id=str(pp_id), actor=request.user)
    except errors.WsnError as exc:
        messages.error(request, f"pull point {pp_id}: {exc.message}")
    else:
        messages.success(request, f"Pull point {pp_id} destroyed.")
    return _back(request, reverse("console:pullpoints"))


@console_view()
@require_http_methods(["GET"])
def registration_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    ctx = _ctx(
        request,
        section="registrations",
        rows=selectors.registration_rows(query=query),
        query=query,
    )
    return render(request, "console/registrations.html", ctx)


@console_view()
@require_http_methods(["GET"])
def peer_list(request: HttpRequest) -> HttpResponse:
    """The federation's peer sites as this site's sync rounds last found them."""
    try:
        rows = peers_status()
        unavailable = ""
    except RedisError as exc:  # the page still answers; the state is unknown meanwhile
        rows, unavailable = [], f"the peers' state is unknown: Redis does not answer ({exc})"
    ctx = _ctx(request, section="peers", rows=rows, unavailable=unavailable)
    return render(request, "console/peers.html", ctx)


# ----------------------------------------------------------------------------- dead letters


@console_view()
@require_http_methods(["GET"])
def dead_letter_list(request: HttpRequest) -> HttpResponse:
    subscription = request.GET.get("subscription", "").strip()
    page = Paginator(
        dead_letters(subscription_id=subscription or None).order_by("-id"), PAGE
    ).get_page(request.GET.get("page"))
    ctx = _ctx(request, section="deadletters", page=page, subscription=subscription)
    return render(request, "console/deadletters.html", ctx)


@console_view(write=True)
@require_POST
def dead_letter_redrive(request: HttpRequest) -> HttpResponse:
    ids = [int(i) for i in request.POST.getlist("id") if i.isdigit()]
    subscription = request.POST.get("subscription", "").strip()
    if not ids and not subscription:
        messages.error(request, "Choose dead letters or a subscription to redrive.")
    else:
        count = console_services.dead_letters_redrive_by_operator(
            ids=ids or None, subscription_id=subscription or None, actor=request.user
        )
        messages.success(
            request,
            f"{count} dead letter(s) queued again"
            + ("" if count else " (their subscriptions no longer exist)")
            + ".",
        )
    return _back(request, reverse("console:deadletters"))


# ----------------------------------------------------------------------------- audit


@console_view()
@require_http_methods(["GET"])
def audit(request: HttpRequest) -> HttpResponse:
    filters = {
        "actor": request.GET.get("who", ""),
        "object_query": request.GET.get("object", ""),
        "object_type": request.GET.get("type", ""),
    }
    reveal = can_change(request.user)
    if not reveal and filters["object_query"]:
        # Read-only users search topics only: page counts of substring searches would spell out
        # subscription and pull point ids (see subscriptions_filtered).
        filters["object_type"] = "topic"
    page = Paginator(audit_entries(**filters), PAGE).get_page(request.GET.get("page"))
    ctx = _ctx(
        request,
        section="audit",
        page=page,
        entries=page if reveal else selectors.audit_rows_masked(entries=page),
        filters=filters,
        actors=audit_actors(),
    )
    return render(request, "console/audit.html", ctx)
