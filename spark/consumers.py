"""A run's progress over WebSocket: the latest state on connect, then each report of the run."""

from __future__ import annotations

import json
from typing import Any

from console.roles import can_view
from hpwsn_site import state
from hpwsn_site.sockets import SessionBoundConsumer
from spark import keys


class RunProgressConsumer(SessionBoundConsumer):
    """For the console's viewers (analysts and above); the stream ends at the first report after
    the login no longer is one."""

    def allows(self, user: Any) -> bool:
        return bool(can_view(user))

    async def connect(self) -> None:
        if await self.refused_at_connect():
            return
        run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = keys.group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        last = await state.get_async_redis().get(keys.progress_key(run_id))
        if last is not None:
            await self.send_json({"type": "progress", "progress": json.loads(last)})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def analytics_progress(self, event: dict[str, Any]) -> None:
        await self.send_if_allowed({"type": "progress", "progress": event["progress"]})
