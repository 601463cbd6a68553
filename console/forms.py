"""Console forms. Values are checked by the topic services (one place for every rule); the forms
only carry them and show the services' errors next to the fields."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from topics.models import Topic
from topics.selectors import BOOL_POLICY_FIELDS

TRI_STATE = [("", "inherit"), ("true", "yes"), ("false", "no")]
LABELS = {
    "reliability": "Reliability",
    "ordered": "Ordered delivery",
    "retry_schedule": "Retry schedule (s, comma separated)",
    "priority": "Priority (0-9)",
    "ttl_seconds": "Time to live (s, 0 = no limit)",
    "fragment_size": "Fragment size (bytes, 0 = never split)",
    "partial_delivery": "Partial delivery of fragments",
    "auto_create_children": "Auto-create children",
    "publish_groups": "Publish groups (comma separated, * = any user)",
    "subscribe_groups": "Subscribe groups (comma separated, * = any user)",
    "anonymous_publish": "Anonymous publish",
    "anonymous_subscribe": "Anonymous subscribe",
    "require_registration": "Only registered publishers (RegisterPublisher)",
}


def _tri(value: bool | None) -> str:
    return "" if value is None else ("true" if value else "false")


class PolicyForm(forms.Form):
    """Description, namespace (roots) and every policy field; inherited values as placeholders."""

    def __init__(
        self,
        *args: Any,
        topic: Topic,
        fields: tuple[str, ...],
        inherited: dict[str, str],
        **kwargs: Any,
    ) -> None:
        initial: dict[str, object] = {"description": topic.description}
        super().__init__(*args, initial=initial, **kwargs)
        self.fields["description"] = forms.CharField(
            required=False, widget=forms.Textarea(attrs={"rows": 2})
        )
        if topic.parent_id is None:
            self.fields["namespace"] = forms.CharField(required=False, label="Root namespace")
            self.initial["namespace"] = topic.namespace
        for name in fields:
            label = LABELS.get(name, name.replace("_", " "))
            own = getattr(topic, name)
            if name == "reliability":
                choices = [("", f"inherit: {inherited[name]}"), *Topic.Reliability.choices]
                self.fields[name] = forms.ChoiceField(choices=choices, required=False, label=label)
                self.initial[name] = own
            elif name in BOOL_POLICY_FIELDS:
                choices = [("", f"inherit: {inherited[name]}"), *TRI_STATE[1:]]
                self.fields[name] = forms.ChoiceField(choices=choices, required=False, label=label)
                self.initial[name] = _tri(own)
            else:
                self.fields[name] = forms.CharField(
                    required=False,
                    label=label,
                    widget=forms.TextInput(attrs={"placeholder": inherited[name]}),
                )
                self.initial[name] = "" if own is None else str(own)

    def changes(self) -> dict[str, object]:
        """The submitted values, as the topic service takes them."""
        return {name: self.cleaned_data.get(name, "") for name in self.fields}

    def add_service_errors(self, exc: ValidationError) -> None:
        if hasattr(exc, "error_dict"):
            for name, errs in exc.message_dict.items():
                self.add_error(name if name in self.fields else None, errs)
        else:
            self.add_error(None, exc.messages)


class CreateTopicForm(forms.Form):
    path = forms.CharField(
        max_length=1024,
        help_text="colon path from the root, e.g. ALL:ALARM:ALARM3; missing parents are created",
    )
    namespace = forms.CharField(required=False, max_length=512, help_text="new roots only")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


class RenameForm(forms.Form):
    name = forms.CharField(max_length=128, label="New name")


class MoveForm(forms.Form):
    parent = forms.CharField(
        required=False,
        max_length=1024,
        label="New parent",
        help_text="path of the new parent; empty: a root topic",
        widget=forms.TextInput(attrs={"list": "topic-paths", "placeholder": "(top level)"}),
    )

    def clean_parent(self) -> Topic | None:
        path = str(self.cleaned_data.get("parent") or "").strip()
        if not path:
            return None
        parent = Topic.objects.filter(path=path).first()
        if parent is None:
            raise ValidationError(f"there is no topic '{path}'")
        return parent


class DeleteTopicForm(forms.Form):
    subscriptions = forms.ChoiceField(
        choices=[
            ("keep", "keep them (they receive again if the topic is re-created)"),
            ("delete", "unsubscribe them"),
        ],
        widget=forms.RadioSelect,
        label="Subscriptions below this topic",
    )


class RenewForm(forms.Form):
    termination_time = forms.CharField(
        initial="PT24H",
        max_length=64,
        help_text="an xsd:duration from now (PT24H, P7D) or an xsd:dateTime",
    )
