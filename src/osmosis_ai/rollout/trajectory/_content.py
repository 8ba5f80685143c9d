"""Flattening of chat message content into ATIF message text or content parts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from osmosis_ai.rollout.sample import JSONObject

__all__ = ["compact_json", "flatten_content", "image_media_type"]

_MEDIA_TYPE_BY_EXTENSION = {
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "png": "image/png",
    "gif": "image/gif",
    "webp": "image/webp",
}
_MEDIA_TYPES = frozenset(_MEDIA_TYPE_BY_EXTENSION.values())


def compact_json(value: object) -> str:
    """``value`` as compact JSON text; objects JSON cannot encode are written as ``str()``."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def image_media_type(url: str) -> str | None:
    """The ATIF media type of an image URL, from its ``data:`` header or file extension."""
    if url[:5].lower() == "data:":
        header = url[5:].split(",", 1)[0]
        mime = header.split(";", 1)[0].strip().lower()
        if mime == "image/jpg":
            return "image/jpeg"
        return mime if mime in _MEDIA_TYPES else None
    try:
        path = urlsplit(url).path
    except ValueError:  # e.g. an unbalanced '[' in the host part
        return None
    name = path.rsplit("/", 1)[-1]
    if "." not in name:
        return None
    return _MEDIA_TYPE_BY_EXTENSION.get(name.rsplit(".", 1)[-1].lower())


def _content_part(item: object) -> JSONObject | None:
    # None means "not a part ATIF can represent": the caller falls back to JSON text.
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind == "text":
        text = item.get("text")
        return {"type": "text", "text": text} if isinstance(text, str) else None
    if kind == "image_url":
        image = item.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        if not isinstance(url, str):
            return None
        media_type = image_media_type(url)
        if media_type is None:
            return None
        return {"type": "image", "source": {"media_type": media_type, "path": url}}
    return None


def flatten_content(content: object) -> str | list[dict[str, Any]]:
    """Turn chat message content into an ATIF ``message`` (or observation ``content``).

    ``None`` gives ``""`` and a string is kept. A list of text parts gives their texts
    joined by newlines; a list of text and image parts gives ATIF content parts. Anything
    else (other part types, images of unknown media type, dicts...) gives compact JSON text
    of the whole content, so nothing is lost.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        parts: list[JSONObject] = []
        for item in content:
            part = _content_part(item)
            if part is None:
                return compact_json(content)
            parts.append(part)
        if all(part["type"] == "text" for part in parts):
            return "\n".join(part["text"] for part in parts)
        return parts
    return compact_json(content)
