"""What the platform's WebSockets share: a login that is read again while the socket is open.

A socket's user is read from its session cookie at the handshake, and a page may keep its socket
open for hours. A logout, a deactivated account or a withdrawn role since then ends the stream at
the next frame the socket would send, not at the page's next reconnect.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


class SessionBoundConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """A JSON socket for the users `allows` admits: checked at connect, and again, from the
    session store, before each frame sent with `send_if_allowed`."""

    def allows(self, user: Any) -> bool:
        """Whether an authenticated, active user may use this socket (run on a thread: it may
        read the database)."""
        raise NotImplementedError

    async def refusal(self, user: Any) -> int | None:
        """The close code `user` earns on this socket, None if it may use it."""
        if user is None or not user.is_authenticated or not user.is_active:
            return CLOSE_UNAUTHENTICATED
        return None if await database_sync_to_async(self.allows)(user) else CLOSE_FORBIDDEN

    async def refused_at_connect(self) -> bool:
        """Closes the handshake of a user the socket does not admit; True when it did."""
        code = await self.refusal(self.scope.get("user"))
        if code is None:
            return False
        await self.close(code=code)
        return True

    async def send_if_allowed(self, content: Any) -> None:
        """Sends `content` if the session still admits its user; closes the socket otherwise."""
        code = await self.refusal(await self._session_user())
        if code is not None:
            await self.close(code=code)
            return
        await self.send_json(content)

    async def _session_user(self) -> Any:
        key = getattr(self.scope.get("session"), "session_key", None)
        if not key:
            return None
        store = import_module(settings.SESSION_ENGINE).SessionStore(key)
        return await get_user({"session": store})
