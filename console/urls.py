from django.contrib.auth import views as auth_views
from django.urls import path

from console import tokens, views
from hpwsn_site.loginguard import LoginForm

app_name = "console"

urlpatterns = [
    path("", views.tree, name="tree"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html",
            next_page="console:tree",
            authentication_form=LoginForm,
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("topics/new/", views.topic_create, name="topic-create"),
    path("topics/<int:pk>/", views.topic_detail, name="topic"),
    path("topics/<int:pk>/rename/", views.topic_rename, name="topic-rename"),
    path("topics/<int:pk>/move/", views.topic_move, name="topic-move"),
    path("topics/<int:pk>/delete/", views.topic_delete, name="topic-delete"),
    path("subscriptions/", views.subscription_list, name="subscriptions"),
    path(
        "subscriptions/<uuid:sub_id>/<slug:action>/",
        views.subscription_action,
        name="subscription-action",
    ),
    path("pullpoints/", views.pull_point_list, name="pullpoints"),
    path("pullpoints/<uuid:pp_id>/remove/", views.pull_point_remove, name="pullpoint-remove"),
    path("registrations/", views.registration_list, name="registrations"),
    path("peers/", views.peer_list, name="peers"),
    path("deadletters/", views.dead_letter_list, name="deadletters"),
    path("deadletters/redrive/", views.dead_letter_redrive, name="deadletters-redrive"),
    path("audit/", views.audit, name="audit"),
    path("tokens/", tokens.token_list, name="tokens"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token-revoke"),
]
