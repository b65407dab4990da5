"""The paginated gallery: pages and their links, escaping, cards, streaming memory, atomic files."""

from __future__ import annotations

import json
import re
import time
import tracemalloc
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from muralist_runtime.outputs import gallery as gallerymod
from muralist_runtime.outputs import gallery_cards, temps
from muralist_runtime.outputs.gallery import write_gallery


class Parsed(HTMLParser):
    """The tags (name, attributes) and the text of a page, as a browser's parser would see them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all(self, tag: str, **where: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in where.items())]

    def classes(self, name: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.tags if name in (a.get("class") or "").split()]


def entry(i: int, **extra: Any) -> dict[str, Any]:
    return {"key": f"{i:05d}-000", "index": i, "prompt": f"prompt {i}", "seed": i, "status": "rendered",
            "file": f"images/{i:05d}-000.png", **extra}


def page_files(root: Path) -> list[Path]:
    """index.html and gallery/page-*.html in page order."""
    return [root / "index.html", *sorted((root / "gallery").glob("page-*.html"))]


def parse(path: Path) -> Parsed:
    return Parsed(path.read_text())


def summary(root: Path) -> dict[str, int]:
    text = (root / "gallery" / "summary.js").read_text()
    found = re.fullmatch(r"muralistSummary\((.*)\);\n", text)
    assert found, text
    return json.loads(found.group(1))


def pager_targets(path: Path) -> list[str]:
    """The hrefs of the first page index on a page, resolved to paths below the gallery root."""
    page = path.read_text()
    nav = page[page.index('<nav class="pager"'):page.index("</nav>")]
    return [str((path.parent / href).resolve()) for href in re.findall(r'href="([^"]+)"', nav)]


# -- pagination --------------------------------------------------------------------------------


@pytest.mark.parametrize(("items", "pages"), [(0, 1), (1, 1), (3, 1), (4, 2), (9, 3), (40, 14)])
def test_page_count_and_prev_next_chain(tmp_path: Path, items: int, pages: int) -> None:
    index = write_gallery(tmp_path, "job", (entry(i) for i in range(items)), page_size=3)
    assert index == tmp_path / "index.html"
    files = page_files(tmp_path)
    assert [f.name for f in files[1:]] == [f"page-{n:05d}.html" for n in range(2, pages + 1)]
    assert summary(tmp_path) == {"items": items, "pages": pages, "pageSize": 3, "rendered": items,
                                 "skipped": 0, "failed": 0, "other": 0}
    cards = [len(parse(f).classes("card")) for f in files]
    assert cards == ([3] * (pages - 1) + [items - 3 * (pages - 1)]) if items else [0]
    for n, path in enumerate(files, start=1):
        parsed = parse(path)
        nexts, prevs = parsed.all("a", rel="next"), parsed.all("a", rel="prev")
        # A page index at the top and the bottom, when there is more than one page.
        assert len(nexts) == (2 if n < pages else 0) and len(prevs) == (2 if n > 1 else 0)
        if n < pages:
            assert (path.parent / str(nexts[0]["href"])).resolve() == files[n].resolve()
        if n > 1:
            assert (path.parent / str(prevs[0]["href"])).resolve() == files[n - 2].resolve()
        assert not parsed.classes("pager") if pages == 1 else len(parsed.classes("pager")) == 2


def test_exactly_page_size_items_is_one_page_and_one_more_is_two(tmp_path: Path) -> None:
    write_gallery(tmp_path / "a", "job", (entry(i) for i in range(200)))
    write_gallery(tmp_path / "b", "job", (entry(i) for i in range(201)))
    assert len(page_files(tmp_path / "a")) == 1 and summary(tmp_path / "a")["pages"] == 1
    assert len(page_files(tmp_path / "b")) == 2
    second = parse(tmp_path / "b" / "gallery" / "page-00002.html")
    assert len(second.classes("card")) == 1 and second.all("a", href="../images/00200-000.png")
    assert "Page 2: item 201 (1 rendered)" in "".join(second.text)


def test_no_items_gives_one_page_that_says_so(tmp_path: Path) -> None:
    write_gallery(tmp_path, "empty job", iter(()))
    page = parse(tmp_path / "index.html")
    assert "This gallery has no items." in page.text and not page.all("nav")
    assert not list((tmp_path / "gallery").glob("page-*"))


def test_page_index_stays_compact_for_thousands_of_pages(tmp_path: Path) -> None:
    write_gallery(tmp_path, "job", ({"key": str(i), "status": "failed"} for i in range(2000)), page_size=1)
    files = page_files(tmp_path)
    assert len(files) == 2000
    root = tmp_path.resolve()
    names = {n: str(p.resolve()) for n, p in enumerate(files, start=1)}
    # prev, first, the current page's NEAR neighbours on each side, last, next: at most 7 links.
    for n in (1, 2, 3, 500, 1997, 1998, 2000):
        targets = pager_targets(files[n - 1])
        assert len(targets) <= 7, (n, targets)
        assert all(t.startswith(str(root)) for t in targets)
        near = {names[m] for m in range(max(1, n - 2), min(2000, n + 2) + 1) if m != n}
        assert near <= set(targets), n
        assert n == 1 or names[1] in targets
    # Pages written with the total in them link the last page; the early ones leave it to summary.js.
    assert names[2000] in pager_targets(files[0])
    assert names[2000] not in pager_targets(files[499]) and 'data-after="502"' in files[499].read_text()
    # One card a page: the page index, CSS and script are all there is, and do not grow with the count.
    sizes = [len(f.read_bytes()) for f in files]
    assert max(sizes) < 6000 and abs(sizes[1899] - sizes[9]) < 100, (max(sizes), sizes[1899], sizes[9])


def test_early_pages_get_the_total_from_summary_js_and_late_ones_have_it(tmp_path: Path) -> None:
    write_gallery(tmp_path, "job", (entry(i, status="failed" if i % 4 == 0 else "rendered") for i in range(10)),
                  page_size=1)
    files = page_files(tmp_path)
    for n, path in enumerate(files, start=1):
        text = path.read_text()
        early = 2 <= n <= 10 - gallerymod.NEAR  # written before the end was known
        assert ('<script src="summary.js"></script>' in text) == early, n
        assert ('data-after="' in text) == early
        if not early:
            assert "10 items on 10 pages &middot; 3 failed" in text
    assert summary(tmp_path)["failed"] == 3


# -- escaping and links ------------------------------------------------------------------------


EVIL = '<script>alert("x")</script>&amp;\'"'


def test_user_strings_are_escaped_everywhere(tmp_path: Path) -> None:
    write_gallery(tmp_path, f"job {EVIL}", [
        entry(0, prompt=EVIL, negativePrompt=EVIL, id=EVIL, key=EVIL, seed=EVIL),
        entry(1, status="failed", error=EVIL, file=None),
        entry(2, status=EVIL),
        entry(3, file=None, shard=EVIL),
    ], caption={"model": EVIL, "scheduler": EVIL, "adapters": [{"name": EVIL, "scale": EVIL}], "strategy": EVIL})
    text = (tmp_path / "index.html").read_text()
    parsed = Parsed(text)
    assert "<script>alert" not in text and not parsed.all("script"), "index.html has no script at all"
    assert text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;amp;&#x27;&quot;") >= 13
    strings = "".join(parsed.text)
    assert strings.count(EVIL) >= 12, "escaped, the strings still read as they were written"
    assert parsed.all("title")
    assert all(a.get("alt") == EVIL for a in parsed.all("img")[:1])
    assert len(parsed.classes("card")) == 4, "no string broke out of its card"


def test_file_names_are_percent_encoded_and_attribute_safe(tmp_path: Path) -> None:
    odd = "images/a \"quoted\" 'name' #1 50%?.png"
    write_gallery(tmp_path, "job", [entry(i) for i in range(2)] + [entry(2, file=odd, poster=odd)], page_size=2)
    first = parse(tmp_path / "gallery" / "page-00002.html")
    (img,) = first.all("img")
    assert img["src"] == "../images/a%20%22quoted%22%20%27name%27%20%231%2050%25%3F.png"
    assert unquote(str(img["src"])) == f"../{odd}"
    assert first.all("a", href=img["src"])


@pytest.mark.parametrize("bad", ["javascript:alert(1)", "/etc/passwd", "../../outside.png", "images/../../x.png",
                                 "http://cdn.example/x.png", "//cdn.example/x.png", "C:\\x.png", "data:text/html,hi"])
def test_paths_that_are_not_plainly_relative_are_never_linked(tmp_path: Path, bad: str) -> None:
    write_gallery(tmp_path, "job", [entry(0, file=bad, input=bad, mask=bad, poster=bad)])
    parsed = parse(tmp_path / "index.html")
    urls = [v for _, a in parsed.tags for k, v in a.items() if k in ("src", "href", "poster") and v]
    assert urls == ["data:,"], urls  # only the empty favicon
    assert bad in parsed.text and "output not linked" in parsed.text


def test_pages_load_nothing_from_outside_the_folder(tmp_path: Path) -> None:
    items = [entry(0, input="inputs/0.png", mask="inputs/0-mask.png"),
             entry(1, file="videos/1.mp4", kind="video", poster="videos/1.png")] * 3
    write_gallery(tmp_path, "job", items, page_size=1)
    root = tmp_path.resolve()
    for path in page_files(tmp_path):
        for _, attrs in parse(path).tags:
            for name in ("src", "href", "poster"):
                url = attrs.get(name)
                if url and url != "data:,":
                    assert "://" not in url and not url.startswith("/")
                    assert (path.parent / unquote(url)).resolve().is_relative_to(root), (path, url)


# -- cards -------------------------------------------------------------------------------------


def test_mp4_plays_inline_with_its_poster_and_animations_are_images(tmp_path: Path) -> None:
    write_gallery(tmp_path, "job", [
        entry(0, file="videos/0.mp4", kind="video", poster="videos/0.poster.png", fps=8, frames=16),
        entry(1, file="videos/1.webp", kind="video", fps=8, frames=16),
        entry(2, file="videos/2.gif", kind="video"),
    ], page_size=2)
    first = parse(tmp_path / "index.html")
    (video,) = first.all("video")
    assert video["src"] == "videos/0.mp4" and video["poster"] == "videos/0.poster.png"
    assert {"muted", "loop", "autoplay", "playsinline"} <= video.keys()
    assert [a["src"] for a in first.all("img")] == ["videos/1.webp"]
    assert "16 frames @ 8 fps" in first.text
    second = parse(tmp_path / "gallery" / "page-00002.html")
    assert [a["src"] for a in second.all("img")] == ["../videos/2.gif"]
    assert all(a.get("loading") == "lazy" for a in first.all("img") + second.all("img"))


def test_inputs_and_mask_are_shown_beside_the_output(tmp_path: Path) -> None:
    write_gallery(tmp_path, "job", [entry(0, input="inputs/00000-000.png", mask="inputs/00000-000-mask.png")])
    parsed = parse(tmp_path / "index.html")
    assert [a["src"] for a in parsed.all("img")] == ["images/00000-000.png", "inputs/00000-000.png",
                                                     "inputs/00000-000-mask.png"]
    assert len(parsed.classes("inputs")) == 1 and {"input", "mask"} <= set(parsed.text)


def test_failed_items_show_the_reason_and_no_output(tmp_path: Path) -> None:
    long_error = "Traceback ...\n" + "x" * 5000 + "\nRuntimeError: CUDA out of memory"
    write_gallery(tmp_path, "job", [
        entry(0, status="failed", error="CUDA out of memory", file=None),
        entry(1, status="failed", error=long_error),
        entry(2, status="failed"),
        entry(3, status="skipped"),
        entry(4, file=None, shard="shards/shard-000001.tar"),
    ])
    parsed = parse(tmp_path / "index.html")
    cards = parsed.classes("card")
    assert [c["class"] for c in cards] == ["card failed"] * 3 + ["card skipped", "card rendered"]
    assert [a["src"] for a in parsed.all("img")] == ["images/00003-000.png"], "a failed item links no output"
    errors = [t for t in parsed.text if "CUDA" in t or "no reason" in t]
    assert errors[0] == "CUDA out of memory" and errors[1].endswith("RuntimeError: CUDA out of memory")
    assert len(errors[1]) <= gallery_cards.MAX_ERROR_CHARS + 1 and "no reason recorded" in parsed.text
    assert "shards/shard-000001.tar" in parsed.text
    assert "Page 1: items 1&ndash;5 (1 rendered, 1 skipped, 3 failed)" in (tmp_path / "index.html").read_text()


def test_job_caption_in_the_header(tmp_path: Path) -> None:
    caption = {"model": "black-forest-labs/FLUX.1-dev", "scheduler": "FlowMatchEulerDiscreteScheduler",
               "adapters": [{"name": "style", "scale": 0.8}, {"name": "detail"}], "strategy": "data-parallel",
               "ignored": "x"}
    write_gallery(tmp_path / "a", "job", [entry(0)], caption=caption)
    write_gallery(tmp_path / "b", "job", [entry(0)])
    job = (tmp_path / "a" / "index.html").read_text().split('<p class="job">')[1].split("</p>")[0]
    assert re.sub(r"<[^>]+>", "", job) == (
        "model black-forest-labs/FLUX.1-dev &middot; scheduler FlowMatchEulerDiscreteScheduler &middot; "
        "adapters style &times;0.8, detail &middot; strategy data-parallel")
    assert '<p class="job">' not in (tmp_path / "b" / "index.html").read_text()


def test_page_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="page_size must be at least 1"):
        write_gallery(tmp_path, "job", [], page_size=0)


# -- streaming and files -----------------------------------------------------------------------


def many(n: int, root: Path | None = None, seen: dict[str, bool] | None = None) -> Iterator[dict[str, Any]]:
    for i in range(n):
        if seen is not None and root is not None and i == n // 2:
            # Halfway through: the early pages are on disk already, the entry point not yet.
            seen["page 200 written"] = (root / "gallery" / "page-00200.html").is_file()
            seen["index.html written"] = (root / "index.html").exists()
        yield entry(i, negativePrompt="blurry, low quality", seconds=0.5,
                    prompt=f"a photograph of item {i}, golden hour, 35mm, highly detailed")


def test_streams_100k_entries_in_small_memory(tmp_path: Path) -> None:
    started = time.perf_counter()
    write_gallery(tmp_path / "plain", "job", many(100_000))
    seconds = time.perf_counter() - started

    seen: dict[str, bool] = {}
    tracemalloc.start()
    try:
        write_gallery(tmp_path / "traced", "job", many(100_000, tmp_path / "traced", seen))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    written = sum(p.stat().st_size for p in page_files(tmp_path / "traced"))
    print(f"\n100,000 entries, 500 pages, {written / 2**20:.0f} MiB of HTML in {seconds:.2f} s; "
          f"peak traced memory {peak / 2**20:.2f} MiB")
    assert summary(tmp_path / "traced")["pages"] == 500
    assert seen == {"page 200 written": True, "index.html written": False}
    # About NEAR + 2 pages of cards are held (page 1, the pending pages, the one being filled):
    # ~0.7 MiB here, against the 50 MiB that holding every entry's card would take.
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert peak < written / 10
    assert seconds < 30, f"{seconds:.1f} s for 100,000 entries (about 1 s on a 2-core box)"


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name.endswith(".tmp")]


def test_every_file_is_renamed_into_place_and_no_temp_file_is_left(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    replaced: list[tuple[str, str]] = []
    real_replace = temps.os.replace

    def recording_replace(src: Any, dst: Any) -> None:
        assert Path(src).read_text(), "the whole file is written before the rename"
        replaced.append((Path(src).name, Path(dst).name))
        real_replace(src, dst)

    (tmp_path / "gallery").mkdir()
    killed = temps.temp_path(tmp_path / "gallery" / "page-00002.html").name.rsplit("-", 1)[0] + "-999999.tmp"
    (tmp_path / "gallery" / killed).write_text("left by a killed writer")
    monkeypatch.setattr(temps.os, "replace", recording_replace)
    write_gallery(tmp_path, "job", (entry(i) for i in range(7)), page_size=2)
    assert [dst for _, dst in replaced] == ["page-00002.html", "page-00003.html", "page-00004.html", "summary.js",
                                            "index.html"], "index.html last: the pages it links are there"
    assert all(src == temps.temp_path(tmp_path / dst).name for src, dst in replaced), "the tree's one temp name"
    assert not temp_files(tmp_path)


def test_a_failing_stream_leaves_no_temp_file(tmp_path: Path) -> None:
    def broken() -> Iterator[dict[str, Any]]:
        yield from (entry(i) for i in range(9))
        raise OSError("manifest unreadable")

    with pytest.raises(OSError, match="manifest unreadable"):
        write_gallery(tmp_path, "job", broken(), page_size=2)
    assert not temp_files(tmp_path) and not (tmp_path / "index.html").exists()


def test_a_shorter_rerun_removes_the_pages_past_its_end(tmp_path: Path) -> None:
    write_gallery(tmp_path, "job", (entry(i) for i in range(10)), page_size=2)
    (tmp_path / "gallery" / "notes.html").write_text("not ours")
    write_gallery(tmp_path, "job", (entry(i) for i in range(3)), page_size=2)
    assert [p.name for p in page_files(tmp_path)] == ["index.html", "page-00002.html"]
    assert (tmp_path / "gallery" / "notes.html").is_file()
    assert summary(tmp_path)["pages"] == 2
