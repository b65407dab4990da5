"""The HTML gallery of an output folder: paginated, self-contained, written as a stream.

Layout under the output directory:

    index.html                page 1 (the entry point)
    gallery/page-00002.html   page 2, ... (5 digits, more past 99,999 pages)
    gallery/summary.js        the totals: muralistSummary({"items": ..., "pages": ..., ...})

Streaming: a job may have a million items, so `write_gallery` never holds them all. It keeps
the page being filled plus the NEAR pages before it (a page's links to its next NEAR pages
need to know those exist) and page 1, and writes every other page as soon as its successors
are known. What such an early page cannot know is the total: how many items and pages there
are, and so the number of the last page. Those live in one small file, gallery/summary.js,
written at the end and loaded by the early pages with a `<script src>` that fills in the total
and the "last page" link; a `<script>` rather than a JSON fetch because browsers refuse fetch()
on file:// pages, and the folder must work opened from disk too. Rewriting the early pages
instead would mean rendering every page twice (5,000 pages of 200 cards for a million items).
Page 1 and the last NEAR pages are written at the end with the total in their HTML, so the
entry point needs no script at all, and without JavaScript an early page lacks only the total.

Files: each is written to a temp name beside it and renamed, so a reader (a web server, a
copy) never sees half a page. Without fsync: the gallery is derived from the manifest and
rewritten by any rerun, and 5,000 fsyncs on a network volume would cost minutes. index.html
goes last, so once it is there every page it leads to is too; pages left from an earlier,
longer run are removed. Every link is relative (pages in gallery/ reach outputs via ../), so
the folder can be copied or served under any path. Nothing external is loaded: the CSS and
the little JavaScript are inline.

Safety (gallery_cards.py): every user string (prompt, id, error, key, file name) is HTML-escaped, and file paths
are also percent-encoded, so quotes, '#' or '?' in a name neither break an attribute nor the
URL. A path that is not plain-relative (absolute, with a scheme such as javascript:, or with
'..') is shown as text and never linked: it would not travel with the folder, or worse.
"""

from __future__ import annotations

import html
import json
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muralist_api.contract.output_folder import GALLERY_DIR, GALLERY_ENTRY, GALLERY_SUMMARY, page_name, page_number

from . import storage, temps
from .gallery_cards import STATUSES, card, job_line

# Pages linked on each side of the current one in the page index.
NEAR = 2


def write_gallery(root: Path, title: str, entries: Iterable[Mapping[str, Any]], page_size: int = 200,
                  caption: Mapping[str, Any] | None = None) -> Path:
    """Write the gallery of `entries` (manifest lines, in display order) under `root`.

    Pages of `page_size` items: root/index.html, then root/gallery/page-NNNNN.html; the totals
    in root/gallery/summary.js. `caption` is the job's model, scheduler, adapters and strategy,
    shown in every page's header. Returns the path of index.html.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, got {page_size}")
    root = Path(root)
    gallery = root / GALLERY_DIR
    gallery.mkdir(parents=True, exist_ok=True)
    for directory in (root, gallery):
        temps.remove_stale(directory)  # a killed gallery writer's
    head = _Head(title, job_line(caption or {}), page_size)

    first: _Page | None = None  # page 1, held until the total is known
    pending: deque[_Page] = deque()  # complete pages waiting to learn that NEAR pages follow
    cards: list[str] = []
    counts: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    number = 1
    for entry in entries:
        if len(cards) == page_size:  # this entry starts page number + 1
            page = _Page(number, "\n".join(cards), counts)
            if number == 1:
                first = page
            else:
                pending.append(page)
            cards, counts = [], Counter()
            number += 1
            while pending and pending[0].number + NEAR <= number:
                _write_page(gallery, head, pending.popleft(), known=number, total=None)
        card_html, status = card(entry, "" if number == 1 else "../")
        cards.append(card_html)
        counts[status] += 1
        totals[status] += 1

    page = _Page(number, "\n".join(cards), counts)
    if number == 1:
        first = page
    else:
        pending.append(page)
    total = _Total(items=sum(totals.values()), pages=number, failed=totals["failed"])
    for page in pending:
        _write_page(gallery, head, page, known=number, total=total)
    summary = {"items": total.items, "pages": total.pages, "pageSize": page_size,
               **{s: totals[s] for s in (*STATUSES, "other")}}
    _atomic_write(gallery / GALLERY_SUMMARY, f"muralistSummary({json.dumps(summary)});\n")
    _remove_pages_after(gallery, total.pages)
    assert first is not None
    return _write_page(root, head, first, known=number, total=total)


# -- pages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Head:
    title: str
    job_line: str  # escaped HTML
    page_size: int


@dataclass(frozen=True)
class _Total:
    items: int
    pages: int
    failed: int

    def text(self) -> str:
        """What follows a page's own count; the same words as muralistSummary() writes."""
        failed = f" &middot; {self.failed:,} failed" if self.failed else ""
        return f" &middot; {self.items:,} items on {self.pages:,} page{'' if self.pages == 1 else 's'}{failed}"


@dataclass(frozen=True)
class _Page:
    number: int
    cards: str  # escaped HTML
    counts: Counter[str]


def _write_page(folder: Path, head: _Head, page: _Page, known: int, total: _Total | None) -> Path:
    """Write `page`; `known` pages exist so far, and `total` is None while the end is unknown."""
    path = folder / (GALLERY_ENTRY if page.number == 1 else page_name(page.number))
    _atomic_write(path, _page_html(head, page, known, total))
    return path


def _href(target: int, at: int) -> str:
    """The link from page `at` to page `target`: index.html sits one level above the others."""
    if at == 1:
        return GALLERY_ENTRY if target == 1 else f"{GALLERY_DIR}/{page_name(target)}"
    return f"../{GALLERY_ENTRY}" if target == 1 else page_name(target)


def _pager(at: int, last: int | None, known: int) -> str:
    """prev, 1 … at-2 … at+2 … last, next; with `last` unknown, a slot summary.js fills."""
    parts: list[str] = []
    parts.append(f'<a rel="prev" href="{_href(at - 1, at)}">&lsaquo; prev</a>' if at > 1
                 else '<span class="off">&lsaquo; prev</span>')
    low, high = max(1, at - NEAR), min(known, at + NEAR)
    if low > 1:
        parts.append(f'<a href="{_href(1, at)}">1</a>')
        if low > 2:
            parts.append('<span class="gap">&hellip;</span>')
    for n in range(low, high + 1):
        parts.append(f'<span aria-current="page">{n}</span>' if n == at else f'<a href="{_href(n, at)}">{n}</a>')
    if last is None:
        parts.append(f'<span class="tail" data-after="{high}"></span>')
    elif high < last:
        if high < last - 1:
            parts.append('<span class="gap">&hellip;</span>')
        parts.append(f'<a href="{_href(last, at)}">{last}</a>')
    parts.append(f'<a rel="next" href="{_href(at + 1, at)}">next &rsaquo;</a>' if at < known
                 else '<span class="off">next &rsaquo;</span>')
    return f'<nav class="pager" aria-label="pages">{"".join(parts)}</nav>'


def _summary_line(head: _Head, page: _Page, total: _Total | None) -> str:
    here = sum(page.counts.values())
    if here == 0:
        return "No items."
    start = (page.number - 1) * head.page_size + 1
    breakdown = ", ".join(f"{page.counts[s]:,} {s}" for s in (*STATUSES, "other") if page.counts[s])
    items = f"item {start:,}" if here == 1 else f"items {start:,}&ndash;{start + here - 1:,}"
    line = f"Page {page.number:,}: {items} ({breakdown})"
    return line + f'<span class="total">{total.text() if total else ""}</span>'


# Fills what an early page could not know, from gallery/summary.js (static code: no user data). Its link to the
# last page is output_folder.page_name's, in JavaScript.
_SUMMARY_SCRIPT = """<script>
function muralistSummary(s) {
  var fmt = function (n) { return n.toLocaleString("en-US"); };
  var total = " \\u00b7 " + fmt(s.items) + " items on " + fmt(s.pages) + " pages" +
    (s.failed ? " \\u00b7 " + fmt(s.failed) + " failed" : "");
  document.querySelectorAll(".total").forEach(function (el) { el.textContent = total; });
  document.querySelectorAll(".tail").forEach(function (el) {
    var after = Number(el.dataset.after);
    if (s.pages <= after) return;
    if (s.pages > after + 1) {
      var gap = document.createElement("span");
      gap.className = "gap";
      gap.textContent = "\\u2026";
      el.appendChild(gap);
    }
    var a = document.createElement("a");
    a.href = "page-" + String(s.pages).padStart(5, "0") + ".html";
    a.textContent = String(s.pages);
    el.appendChild(a);
  });
}
</script>
""" + f'<script src="{GALLERY_SUMMARY}"></script>'

_CSS = """
:root{color-scheme:light dark;--bg:#f4f4f5;--card:#fff;--fg:#18181b;--muted:#6b6b76;--line:#dedee3;
--accent:#2455c7;--bad:#b42318;--badbg:#fdf0ef;--media:#101014}
@media (prefers-color-scheme:dark){:root{--bg:#141417;--card:#222227;--fg:#ededf0;--muted:#a0a0ab;
--line:#37373e;--accent:#7aa7ff;--bad:#ff9b90;--badbg:#3a1512}}
*{box-sizing:border-box}
body{margin:0;padding:18px 22px 28px;background:var(--bg);color:var(--fg);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","DejaVu Sans",sans-serif}
h1{margin:0 0 4px;font-size:21px;overflow-wrap:anywhere}
.job,.summary{margin:2px 0;color:var(--muted);font-size:13px}
.job b{color:var(--fg);font-weight:600}
.pager{display:flex;flex-wrap:wrap;gap:4px;align-items:center;margin:12px 0}
.pager a,.pager span{display:inline-block;min-width:2em;padding:3px 9px;border:1px solid var(--line);border-radius:6px;
background:var(--card);color:var(--accent);text-align:center;text-decoration:none}
.pager a:hover{border-color:var(--accent)}
.pager [aria-current]{background:var(--accent);border-color:var(--accent);color:var(--card);font-weight:600}
.pager .gap,.pager .tail{min-width:0;padding:3px 2px;border:0;background:none;color:var(--muted)}
.pager .tail{padding:0;display:contents}
.pager .off{color:var(--muted);opacity:.55}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:14px;margin:12px 0}
.empty{color:var(--muted)}
.card{margin:0;display:flex;flex-direction:column;overflow:hidden;background:var(--card);border:1px solid var(--line);
border-radius:10px;box-shadow:0 1px 2px #0000000f}
.card.failed{border-color:var(--bad)}
.media{display:flex;aspect-ratio:1;background:var(--media)}
.out{flex:1;min-width:0;height:100%;display:flex;align-items:center;justify-content:center}
.out img,.out video{display:block;width:100%;height:100%;object-fit:contain}
.inputs{display:flex;flex-direction:column;gap:8px;width:76px;padding:8px;background:#ffffff0d}
.thumb{margin:0}
.thumb img{display:block;width:60px;height:60px;object-fit:cover;border-radius:4px;background:#ffffff1a;
outline:1px solid #ffffff40}
.thumb figcaption{color:#c8c8d0;font-size:11px;text-align:center}
.placeholder{flex:1;min-width:0;height:100%;display:flex;flex-direction:column;gap:6px;align-items:center;justify-content:center;
padding:14px;color:#c8c8d0;text-align:center;overflow-wrap:anywhere}
.failed .placeholder{background:var(--badbg);color:var(--bad);font-weight:600}
.cap{padding:9px 11px 11px}
.meta{display:flex;flex-wrap:wrap;gap:2px 10px;align-items:baseline;color:var(--muted);font-size:12px}
.key{color:var(--fg);font:600 12px ui-monospace,"DejaVu Sans Mono",monospace}
.badge{padding:0 6px;border-radius:9px;background:var(--line);color:var(--fg);font-size:11px}
.badge.failed{background:var(--bad);color:var(--card)}
.prompt{margin:6px 0 0;overflow-wrap:anywhere}
.neg{margin:3px 0 0;color:var(--muted);font-size:12.5px;overflow-wrap:anywhere}
.error{margin:7px 0 0;max-height:11em;overflow:auto;padding:6px 8px;border-radius:6px;background:var(--badbg);
color:var(--bad);font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;white-space:pre-wrap;overflow-wrap:anywhere}
.file{margin:5px 0 0;font-size:12px;overflow-wrap:anywhere}
.file a{color:var(--accent)}
"""


def _page_html(head: _Head, page: _Page, known: int, total: _Total | None) -> str:
    esc = html.escape
    pager = _pager(page.number, total.pages if total else None, known) if known > 1 else ""
    body = f"<main>\n{page.cards}\n</main>" if page.cards else '<p class="empty">This gallery has no items.</p>'
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        # An empty icon: else every browser asks for /favicon.ico, a 404 outside our folder.
        '<link rel="icon" href="data:,">'
        f"<title>{esc(head.title)} &middot; page {page.number:,} &middot; Muralist</title>"
        f"<style>{_CSS}</style></head><body>\n"
        f"<header><h1>{esc(head.title)}</h1>{head.job_line}"
        f'<p class="summary">{_summary_line(head, page, total)}</p></header>\n'
        f"{pager}\n{body}\n{pager}\n"
        + (_SUMMARY_SCRIPT + "\n" if total is None else "")
        + "</body></html>\n"
    )


# -- files -------------------------------------------------------------------------------------


def _atomic_write(path: Path, text: str) -> None:
    # On a volume, the output tree's temp names (temps.py): the clean-ups at start and after the merge find ours.
    storage.at(path).write(path, text.encode("utf-8"), fsync=False)


def _remove_pages_after(gallery: Path, last: int) -> None:
    """Pages of an earlier run with more items: they would link into the new gallery wrongly."""
    files = storage.at(gallery)
    for name in files.names(gallery):
        number = page_number(name)
        if number is not None and number > last:
            files.remove(gallery / name)
