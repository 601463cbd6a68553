from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

# An address is at most 45 characters (IPv6 with an IPv4 tail); X-Forwarded-For is the client's
# word, so a longer one is cut rather than stored whole.
CLIENT_ADDRESS_MAX = 64


class PullPoint(models.Model):
    """A queue a consumer drains with GetMessages; also the thesis's push endpoint (5.1.1)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    address = models.CharField(max_length=2048, blank=True, default="")
    # Who created it (topics.acl.Principal.owner): only they, admins and operators may read or
    # destroy it (topics.acl.may_act_on). Rows made before owners were recorded are "anonymous".
    owner = models.CharField(max_length=300, default="anonymous", db_index=True)
    # The client address of an anonymous creator (hpwsn_site.clients.client_address), "" for an
    # authenticated one: anonymous callers' allowances are counted per address
    # (subscriptions/allowance.py). Rows made before it was recorded have "".
    created_from = models.CharField(
        max_length=CLIENT_ADDRESS_MAX, blank=True, default="", db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Last GetMessages (at most a minute stale); unused for HPWSN_PULLPOINT_IDLE_S: destroyed.
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Destroyed pull points are kept as tombstones so a second DestroyPullPoint is answered
    # with UnableToDestroyPullPointFault rather than "unknown".
    destroyed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return str(self.id)


class Subscription(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        PAUSED = "paused"
        # The consumer failed continuously for HPWSN_SUSPEND_AFTER_S: the queue fills (bounded),
        # nothing is pushed until Renew, ResumeSubscription or an operator resumes it.
        SUSPENDED = "suspended"

    class Mode(models.TextChoices):
        PUSH = "push"  # Notify POSTed to consumer_address
        PULL = "pull"  # kept in the pull point's queue for GetMessages

    class Format(models.TextChoices):
        WSN = "wsn"  # a wsnt:Notify envelope
        CLOUDEVENTS = "cloudevents"  # CloudEvents 1.0 JSON, structured mode (hpwsn/cloudevents.py)

    # The id is part of the SubscriptionReference address, so it is random, not a counter.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    consumer_address = models.CharField(max_length=2048)
    # The SubscriptionReference address handed to the subscriber (contains the id).
    reference_address = models.CharField(max_length=2048, blank=True, default="")
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.PUSH)
    pull_point = models.ForeignKey(
        PullPoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="subscriptions"
    )
    topic_expression = models.TextField(blank=True, default="")
    topic_dialect = models.CharField(max_length=256, blank=True, default="")
    topic_nsmap = models.JSONField(default=dict, blank=True)
    # Colon path of the topic for concrete expressions; empty for wildcard (Full) expressions.
    topic_path = models.CharField(max_length=1024, blank=True, default="", db_index=True)
    content_filter = models.TextField(blank=True, default="")
    content_dialect = models.CharField(max_length=256, blank=True, default="")
    content_nsmap = models.JSONField(default=dict, blank=True)
    # Who created it (topics.acl.Principal.owner): only they, admins and operators may renew,
    # pause, resume or end it (topics.acl.may_act_on). Rows made before owners were recorded
    # are "anonymous", which keeps every reference handed out before working as it did.
    owner = models.CharField(max_length=300, default="anonymous", db_index=True)
    # The client address of an anonymous creator (hpwsn_site.clients.client_address), "" for an
    # authenticated one: anonymous callers' allowances are counted per address
    # (subscriptions/allowance.py). Rows made before it was recorded have "".
    created_from = models.CharField(
        max_length=CLIENT_ADDRESS_MAX, blank=True, default="", db_index=True
    )
    # Values of %0, %1, ... in an SQL-like filter (hpwsn:FilterParameters): one expression text
    # serves many subscribers, each with its own values.
    filter_parameters = models.JSONField(default=list, blank=True)
    # WS-BaseNotification ProducerProperties, in the SQL-like dialect over the $ properties.
    producer_filter = models.TextField(blank=True, default="")
    producer_dialect = models.CharField(max_length=256, blank=True, default="")
    # hpwsn:InterestPath of a peer site's link: the sites the interest came through, the peer
    # last (federation.peers.Interest). This site relays it to its other peers; empty otherwise.
    interest_path = models.JSONField(default=list, blank=True)
    # hpwsn:Peers of a peer site's link: that site's other peers. It asks them for its interest
    # itself, so this site does not relay the interest to them.
    site_peers = models.JSONField(default=list, blank=True)
    # Same owner + same consumer + same expression + same filter = the same subscription
    # (thesis 5.3.1; subscriptions.services.subscription_dedup_key).
    dedup_key = models.CharField(max_length=64, unique=True)
    soap_version = models.CharField(max_length=3, default="1.1")
    use_raw = models.BooleanField(default=False)
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.WSN)
    # Pushes carry Standard Webhooks HMAC signature headers when set (see docs/protocol.md).
    signing_secret = models.CharField(max_length=256, blank=True, default="")
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    termination_time = models.DateTimeField(null=True, blank=True, db_index=True)
    # Set by subscription_create from the clock every host shares (the fan-out compares it with
    # the acceptance time of reliable messages, set by whichever web process took them).
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.topic_expression or '*'} -> {self.consumer_address}"


class PublisherRegistration(models.Model):
    """A publisher registered with RegisterPublisher (WS-Brokered), at an address of its own."""

    # Part of the PublisherRegistrationReference address: random, not a counter.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    reference_address = models.CharField(max_length=2048, blank=True, default="")
    # The PublisherReference's wsa:Address: a Notify whose ProducerReference names it is from it.
    publisher_address = models.CharField(max_length=2048, db_index=True)
    # Who registered it (topics.acl.Principal.owner): only they, admins and operators may renew or
    # destroy it (topics.acl.may_act_on), as for subscriptions. Rows made before owners were
    # recorded are "anonymous", which keeps every reference handed out before working.
    owner = models.CharField(max_length=300, default="anonymous", db_index=True)
    # The client address of an anonymous creator (hpwsn_site.clients.client_address), "" for an
    # authenticated one: anonymous callers' allowances are counted per address
    # (subscriptions/allowance.py). Rows made before it was recorded have "".
    created_from = models.CharField(
        max_length=CLIENT_ADDRESS_MAX, blank=True, default="", db_index=True
    )
    # Colon paths of the topics it registered for (each covers its subtree); empty: every topic.
    topic_paths = models.JSONField(default=list, blank=True)
    termination_time = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Demand-based publishing: the broker subscribes to the publisher's NotificationProducer for
    # each registered topic while the topic has subscribers here, and pauses that subscription
    # while it has none. demand_state: topic path -> {"address": its SubscriptionReference at the
    # publisher, "paused": bool}.
    demand = models.BooleanField(default=False)
    broker_address = models.CharField(max_length=2048, blank=True, default="")
    demand_state = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.publisher_address} -> {', '.join(self.topic_paths) or '*'}"
