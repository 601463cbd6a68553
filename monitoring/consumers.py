"""The dashboard's WebSocket: history on connect, then one snapshot a second from the group."""

from __future__ import annotations

from typing import Any

from hpwsn_site.sockets import SessionBoundConsumer
from monitoring import keys, selectors


class StatsConsumer(SessionBoundConsumer):
    """For staff users; the stream ends at the first snapshot after the login no longer is one."""

    def allows(self, user: Any) -> bool:
        return bool(user.is_staff)

    async def connect(self) -> None:
        if await self.refused_at_connect():
            return
        await self.channel_layer.group_add(keys.GROUP, self.channel_name)
        await self.accept()
        await self.send_json(
            {
                "type": "history",
                "points": await selectors.history_aget(),
                "stats": await selectors.last_snapshot_aget(),
            }
        )

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(keys.GROUP, self.channel_name)

    async def monitoring_stats(self, event: dict[str, Any]) -> None:
        await self.send_if_allowed({"type": "stats", "stats": event["stats"]})
