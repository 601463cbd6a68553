"""A run's progress over WebSocket: the latest state on connect, then each report of the run."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.roles import can_view
from hpwsn_site import state
from spark import keys

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def _may_view(user: Any) -> bool:
    return bool(can_view(user))


class RunProgressConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await database_sync_to_async(_may_view)(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = keys.group(str(self.scope["url_route"]["kwargs"]["run_id"]))
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        last = await state.get_async_redis().get(keys.progress_key(run_id))
        if last is not None:
            await self.send_json({"type": "progress", "progress": json.loads(last)})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def analytics_progress(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "progress", "progress": event["progress"]})
