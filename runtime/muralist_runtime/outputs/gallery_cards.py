"""One item's card in the gallery (its media, inputs and caption) and the job's header line.

Every user string (prompt, id, error, key, file name) is HTML-escaped, and file paths are also
percent-encoded; a path that is not plain-relative (absolute, with a scheme, or with '..') is
shown as text and never linked (see gallery.py).
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from muralist_api.items import printable

# Played by a <video> element; everything else (png, jpeg, animated webp and gif) is an <img>.
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".webm", ".mov", ".ogv")
STATUSES = ("rendered", "skipped", "failed")
# A traceback can be long; the card shows its end (the exception), the full one is in the logs.
MAX_ERROR_CHARS = 2000
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def job_line(caption: Mapping[str, Any]) -> str:
    """model, scheduler, adapters (name and scale), strategy (strategy Auto's plan, its reasons on hover),
    each escaped; "" when none is given."""
    esc = html.escape
    parts = []
    for label in ("model", "scheduler"):
        if caption.get(label):
            parts.append(f"{label} <b>{esc(str(caption[label]))}</b>")
    adapters = []
    for adapter in caption.get("adapters") or ():
        if isinstance(adapter, Mapping) and adapter.get("name"):
            scale = adapter.get("scale")
            adapters.append(f"<b>{esc(str(adapter['name']))}</b>"
                            + (f" &times;{esc(str(scale))}" if scale is not None else ""))
    if adapters:
        parts.append(("adapter " if len(adapters) == 1 else "adapters ") + ", ".join(adapters))
    if caption.get("plan"):  # strategy Auto: the plan, its reasons on hover
        reasons = "\n".join(str(r) for r in caption.get("planReasons") or ())
        parts.append(f'strategy <b title="{esc(reasons)}">{esc(str(caption["plan"]))}</b>')
    elif caption.get("strategy"):
        parts.append(f"strategy <b>{esc(str(caption['strategy']))}</b>")
    return f'<p class="job">{" &middot; ".join(parts)}</p>' if parts else ""


# -- cards -------------------------------------------------------------------------------------


def _url(path: Any, prefix: str) -> str | None:
    """The escaped, percent-encoded URL of an output path relative to the folder, or None when
    the path is not plainly relative (it would break when the folder moves, or run script)."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or _SCHEME.match(path):
        return None
    if ".." in path.split("/"):
        return None
    return html.escape(prefix + quote(path, safe="/"), quote=True)


def _text(value: Any) -> str:
    # printable: a page is UTF-8, which has no lone surrogates (a row's text may hold one).
    return html.escape(printable(str(value)), quote=True)


def _media(entry: Mapping[str, Any], file_url: str, alt: str, prefix: str) -> str:
    name = str(entry.get("file", "")).lower()
    if name.endswith(VIDEO_EXTENSIONS):
        poster = _url(entry.get("poster"), prefix)
        poster_attr = f' poster="{poster}"' if poster else ""
        # muted + playsinline: what browsers require to autoplay; a poster shows until it plays
        # (and stays where the codec is missing); the link opens the file itself.
        return (f'<a class="out" href="{file_url}" title="{alt}"><video src="{file_url}"{poster_attr} muted loop '
                f'autoplay playsinline preload="metadata"></video></a>')
    # Animated webp and gif play as images.
    return (f'<a class="out" href="{file_url}"><img src="{file_url}" alt="{alt}" loading="lazy" '
            f'decoding="async"></a>')


def _inputs(entry: Mapping[str, Any], prefix: str) -> str:
    thumbs = []
    for field in ("input", "mask"):
        url = _url(entry.get(field), prefix)
        if url:
            thumbs.append(f'<figure class="thumb"><a href="{url}"><img src="{url}" alt="{field} image" '
                          f'loading="lazy" decoding="async"></a><figcaption>{field}</figcaption></figure>')
    return f'<div class="inputs">{"".join(thumbs)}</div>' if thumbs else ""


def card(entry: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    """One item's <figure> (escaped HTML) and its status bucket (one of STATUSES or "other")."""
    raw_status = str(entry.get("status") or "rendered")
    status = raw_status if raw_status in STATUSES else "other"
    key = _text(entry.get("key", entry.get("index", "?")))
    prompt = entry.get("prompt")
    alt = _text(prompt) if prompt else key
    file_url = _url(entry.get("file"), prefix) if status != "failed" else None

    if file_url:
        media = _media(entry, file_url, alt, prefix)
    else:
        if status == "failed":
            text = "failed"
        elif entry.get("shard"):
            text = f"in shard <code>{_text(entry['shard'])}</code>"
        elif entry.get("file"):
            text = "output not linked"
        else:
            text = "no output file"
        media = f'<div class="placeholder">{text}</div>'
    media = f'<div class="media">{media}{_inputs(entry, prefix)}</div>'

    meta = [f'<b class="key">{key}</b>']
    if status != "rendered":
        meta.append(f'<span class="badge {status}">{_text(raw_status)}</span>')
    if entry.get("id") not in (None, ""):
        meta.append(f"<span>id {_text(entry['id'])}</span>")
    if entry.get("seed") is not None:
        meta.append(f"<span>seed {_text(entry['seed'])}</span>")
    if entry.get("frames") or entry.get("fps"):
        video = [f"{_text(entry['frames'])} frames" if entry.get("frames") else "",
                 f"{_text(entry['fps'])} fps" if entry.get("fps") else ""]
        meta.append(f"<span>{' @ '.join(v for v in video if v)}</span>")
    if isinstance(entry.get("seconds"), int | float):
        meta.append(f"<span>{entry['seconds']:.2f} s</span>")

    caption = [f'<div class="meta">{"".join(meta)}</div>']
    if prompt:
        caption.append(f'<p class="prompt">{_text(prompt)}</p>')
    if entry.get("negativePrompt"):
        caption.append(f'<p class="neg">not: {_text(entry["negativePrompt"])}</p>')
    if status == "failed":
        error = str(entry.get("error") or "no reason recorded")
        if len(error) > MAX_ERROR_CHARS:
            error = "\u2026" + error[-MAX_ERROR_CHARS:]
        caption.append(f'<pre class="error">{_text(error)}</pre>')
    elif entry.get("file") and not file_url:
        caption.append(f'<p class="file">{_text(entry["file"])}</p>')

    index = entry.get("index")
    anchor = f' id="item-{index}"' if isinstance(index, int) and not isinstance(index, bool) else ""
    return (f'<figure class="card {status}"{anchor}>{media}<figcaption class="cap">{"".join(caption)}'
            f"</figcaption></figure>"), status
