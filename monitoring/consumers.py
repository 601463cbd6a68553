"""The dashboard's WebSocket: history on connect, then one snapshot a second from the group."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

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
        # The login was read once, at connect: a logout, a deactivated account or a withdrawn
        # staff flag since then ends the stream here rather than at the next reconnect.
        refusal = await self._refusal()
        if refusal is not None:
            await self.close(code=refusal)
            return
        await self.send_json({"type": "stats", "stats": event["stats"]})

    async def _refusal(self) -> int | None:
        """The close code the socket's session now earns, read again from the session store."""
        key = getattr(self.scope.get("session"), "session_key", None)
        if not key:
            return CLOSE_UNAUTHENTICATED
        store = import_module(settings.SESSION_ENGINE).SessionStore(key)
        user = await get_user({"session": store})
        if not user.is_authenticated:
            return CLOSE_UNAUTHENTICATED
        return None if user.is_staff else CLOSE_FORBIDDEN
