"""Starlette's ``StaticFiles`` with the headers and media types the page's files are served with.

Starlette finds the file (no path outside the directory, no symlink out of it), sends it, and answers
a matching ``If-None-Match`` or ``If-Modified-Since`` with 304. On top of that:

- ``Cache-Control: no-cache``: the browser asks again on every use, so an upgraded orchestrator is never
  served stale, and an unchanged file costs a 304 with no body;
- ``X-Content-Type-Options: nosniff``, with the media type fixed here by suffix rather than guessed
  from the platform's MIME table (some map ``.js`` to ``application/javascript``, or know no ``.mjs``);
- a file of any other suffix is 404, so nothing else that lands in the directory is served.
"""

from __future__ import annotations

import os

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from starlette.types import Scope

#: The served suffixes and their media types (text types get ``; charset=utf-8`` from Starlette).
MEDIA_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
}
STATIC_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


class RevalidatedStaticFiles(StaticFiles):
    """Static files revalidated on every use, of the suffixes in :data:`MEDIA_TYPES` only."""

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        """The file with :data:`STATIC_HEADERS` (a 304 when the client's copy is current); 404 for a
        suffix not in :data:`MEDIA_TYPES`."""
        media_type = MEDIA_TYPES.get(os.path.splitext(full_path)[1])
        if media_type is None:
            raise HTTPException(status_code=404)
        response = FileResponse(
            full_path,
            status_code=status_code,
            headers=STATIC_HEADERS,
            media_type=media_type,
            stat_result=stat_result,
        )
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            return NotModifiedResponse(response.headers)  # keeps Cache-Control and ETag
        return response
