"""The dashboard's WebSocket: history on connect, then one snapshot a second from the group."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from monitoring import keys, selectors

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


class StatsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not user.is_staff:
            await self.close(code=CLOSE_FORBIDDEN)
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
        await self.send_json({"type": "stats", "stats": event["stats"]})
