"""Monarch's distributed web crawler (``docs/source/examples/crawler.py``): one queue
actor, eight crawlers that take pages off it and queue the links they find, to a
depth of 3; against a small website that the test serves on 127.0.0.1 (never the
internet). The result is checked: every page within reach crawled exactly once,
nothing beyond the depth, nothing off the site."""

from __future__ import annotations

import http.server
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from crawler_actors import CrawlActor, QueueActor

from monarch_kernel import ProcMesh, this_host

DEPTH = 3
NUM_CRAWLERS = 8
#: Generous for a busy machine; never a measure of speed.
WAIT = 300


def _page(*links: str) -> bytes:
    anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return f"<html><body><ul>{anchors}</ul></body></html>".encode()


def _site(base: str) -> dict[str, bytes]:
    """Pages by path. Depths from the base page (3): a and b 2, c 1, d 0 (fetched, its
    links not followed), e never. Links to pages seen already (c from a and b, the
    base from c, b with a query and a fragment) are crawled once; the page off the
    site never."""
    return {
        "/": _page("a.html", "b.html?from=index#top", "https://example.invalid/elsewhere"),
        "/a.html": _page("c.html", base),
        "/b.html": _page("c.html", "a.html"),
        "/c.html": _page("d.html", base),
        "/d.html": _page("e.html", "https://example.invalid/again"),
        "/e.html": _page("a.html"),
    }


class Website:
    """A website served from a thread of this process on 127.0.0.1 (a free port),
    which keeps the path of every request."""

    def __init__(self) -> None:
        site = self
        self.requested: list[str] = []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with site.lock:
                    site.requested.append(self.path)
                body = site.pages.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.pages = _site(self.base)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)


@pytest.fixture
def website() -> Iterator[Website]:
    site = Website()
    try:
        yield site
    finally:
        site.close()


@pytest.mark.slow
def test_eight_crawlers_sharing_one_queue_crawl_every_page_within_the_depth_once(website):
    """The example's ``main()``: a ``QueueActor`` on every proc, of which the first
    is the queue; the base URL queued at depth 3; eight ``CrawlActor``s crawl until
    the queue stays empty; the pages they report add up to the pages within reach."""
    start_time = time.time()

    # Start up a ProcMesh.
    local_proc_mesh: ProcMesh = this_host().spawn_procs(per_host={"procs": NUM_CRAWLERS})

    # Create queues across the mesh and use slice to target the first one.
    all_queues = local_proc_mesh.spawn("queues", QueueActor)
    target_queue = all_queues.slice(procs=slice(0, 1))

    # Prime the queue with the base URL we want to crawl.
    target_queue.insert.broadcast(website.base, DEPTH)

    # Make the crawlers and pass in the queues.
    crawlers = local_proc_mesh.spawn("crawlers", CrawlActor, all_queues, website.base)

    # Run the crawlers; display the count of documents they crawled when done.
    results = crawlers.crawl.call().get(timeout=WAIT)

    # Shut down all our resources.
    local_proc_mesh.stop().get(timeout=WAIT)

    pages = sum(v for _, v in results.items())
    duration = time.time() - start_time
    print(f"Finished - Found {pages} in {duration:.2f} seconds.\n{results}.")

    assert len(results.values()) == NUM_CRAWLERS
    assert pages == 5
    assert Counter(website.requested) == {"/": 1, "/a.html": 1, "/b.html": 1, "/c.html": 1, "/d.html": 1}
