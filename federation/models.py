"""Federation: the subscriptions this site holds at its peers (its links)."""

from __future__ import annotations

from django.db import models


class Link(models.Model):
    """A subscription this site made at a peer for one topic subtree its subscribers want.

    One per peer and topic path (the interest is reduced so that no two overlap): a notification
    is forwarded once per peer, however many subscribers want it here.
    """

    peer = models.CharField(max_length=63)
    topic_path = models.CharField(max_length=1024)
    reference = models.CharField(max_length=2048)  # the SubscriptionReference at the peer
    expires_at = models.FloatField()  # epoch seconds; renewed well before
    # The interest path the link states at the peer (federation.peers.interest_for_peer): when
    # the interest it stands for comes by another path, the link is made again with it.
    interest_path = models.JSONField(default=list, blank=True)
    # The ProducerProperties filter the link states (federation.peers.link_filter): it names this
    # site's other peers, so when they change the link is made again with the new one.
    producer_filter = models.TextField(blank=True, default="")
    # The account the link was made with at the peer (HPWSN_FEDERATION_CREDENTIALS; empty:
    # anonymous): the link is that account's there, so when it changes the link is made again.
    user = models.CharField(max_length=300, blank=True, default="")
    # Made with this site's SigningSecret (federation.peers.link_signing_secret): the peer signs
    # its pushes. A link from before is made again with it.
    signed = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["peer", "topic_path"], name="federation_link_once")
        ]

    def __str__(self) -> str:
        return f"{self.peer} {self.topic_path}"
