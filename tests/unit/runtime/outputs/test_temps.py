"""Temporary files of the output tree: one name for every writer, none left once the job has merged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime import main
from muralist_runtime.outputs import layouts, shards, temps, writer
from muralist_runtime.run_state import RunState
from muralist_runtime.work.chunks import NothingLeft

# Every writer of the output tree, killed at its rename: the process dies there, so it cleans
# nothing up (os.replace raises, unlinks do nothing, then os._exit).
KILLED_WRITERS = r"""
import os, pathlib, sys
from pathlib import Path

root = Path(sys.argv[1])
from muralist_runtime.outputs import layouts, merge, parts, shards, writer


class Killed(BaseException):
    pass


def killed(*args, **kwargs):
    raise Killed


os.replace = killed
os.unlink = pathlib.Path.unlink = lambda *args, **kwargs: None


def shard():
    w = shards.ShardWriter(root / "shards", 3)
    w.add("00000009-000", {"png": b"png", "json": b"{}"})
    w.close()


writes = [
    lambda: writer.atomic_write_text(root / "job.json", "{}"),
    lambda: parts.write_part(root, 1, [{"key": "00000001-000", "index": 1, "status": "rendered"}]),
    lambda: writer.atomic_write_bytes(root / "images" / "00000001-000.png", b"png"),
    shard,
    lambda: merge.merge(root, 1, "job", 2, {}),  # the manifest, the index and the gallery's first file
]
for write in writes:
    try:
        write()
    except Killed:
        pass
print(os.getpid(), flush=True)
os._exit(9)
"""

# A slow duplicate writer (a sweeping group on a chunk another group finished): it writes a
# shard while the job merges, and renames it after the merge's clean-up.
SLOW_DUPLICATE = r"""
import sys
from pathlib import Path

from muralist_runtime.outputs import shards, temps

w = shards.ShardWriter(Path(sys.argv[1]) / "shards", 3)
w.add("00000009-000", {"png": b"the duplicate's", "json": b"{}"})
print(w.tmp, flush=True)
sys.stdin.readline()  # the job merges meanwhile
try:
    w.close()
except temps.TempRemoved as e:
    print("TempRemoved:", e, flush=True)
"""


def run_python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def temp_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if p.name.endswith(".tmp"))


def webdataset_runtime(root: Path) -> RuntimeSpec:
    return RuntimeSpec.model_validate({
        "name": "w", "outputDir": str(root),
        "spec": {"model": {"name": "muralist/tiny-flux"}, "prompts": ["a cat"],
                 "output": {"layout": "webdataset"}},
    })


def test_every_writer_of_the_tree_names_its_temp_alike_and_the_start_removes_a_killed_ones(tmp_path: Path) -> None:
    root = tmp_path / "out"
    for folder in ("images", "shards", "parts"):
        (root / folder).mkdir(parents=True)
    (root / "shards" / "shard-000000.tar").write_bytes(b"a finished shard")
    proc = run_python(KILLED_WRITERS, str(root))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 9, err
    pid = int(out.split()[0])
    left = temp_files(root)
    folders = {Path(p).parent.name or "." for p in left}
    assert folders == {".", "images", "shards", "parts", "gallery"}, left
    for name in left:
        final = root / Path(name).parent / Path(name).name[1:].rsplit(".", 2)[0]
        assert Path(name).name == temps.temp_path(final).name.replace(f"-{os.getpid()}.", f"-{pid}."), \
            "one temp name for every writer"

    layouts.WebDatasetLayout(webdataset_runtime(root), rank=1).prepare()  # the next pod's start
    assert temp_files(root) == [], "a killed writer's temp, in any folder, is removed at start"
    assert (root / "shards" / "shard-000000.tar").read_bytes() == b"a finished shard"


def test_once_merged_no_temp_is_left_and_a_slow_duplicate_ends_without_a_trace(tmp_path: Path) -> None:
    root = tmp_path / "out"
    for folder in ("shards", "gallery"):
        (root / folder).mkdir(parents=True)
    with shards.ShardWriter(root / "shards", 3) as first:  # the group that finished chunk 3
        first.add("00000009-000", {"png": b"png", "json": b"{}"})
    finished = (root / "shards" / "shard-000003.tar").read_bytes()
    # What the clean-up at start keeps: another pod's temp (its writer may be alive), and names
    # of an older runtime.
    left = [root / "shards" / ".shard-000001.tar.other-pod-17.tmp", root / ".index.html.123.tmp",
            root / ".manifest.jsonl.merge.tmp", root / "gallery" / ".summary.js.5.tmp"]
    for path in left:
        path.write_bytes(b"partial")
    neighbour = root / "another-job" / ".job.json.other-pod-3.tmp"  # output.path "." puts jobs side by side
    neighbour.parent.mkdir()
    neighbour.write_bytes(b"another job's, being written")
    duplicate = run_python(SLOW_DUPLICATE, str(root), stdin=subprocess.PIPE)
    assert duplicate.stdout is not None and duplicate.stdin is not None
    writing = Path(duplicate.stdout.readline().strip())
    assert writing.is_file()
    assert temps.remove_stale_in(layouts.tree(root)) == [], "all of them may still be written"

    removed = temps.remove_all_in(layouts.tree(root))  # the job merged
    assert sorted(removed) == sorted([*left, writing])
    out, err = duplicate.communicate("go on\n", timeout=60)
    assert duplicate.returncode == 0, err
    assert out.startswith("TempRemoved: the temp file of ") and "shard-000003.tar" in out
    assert temp_files(root) == [str(neighbour.relative_to(root))], "the tree's temps only"
    assert (root / "shards" / "shard-000003.tar").read_bytes() == finished, "the finished shard stays as it was"


def test_a_duplicate_overtaken_by_the_merge_ends_as_a_run_with_nothing_left(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from muralist_runtime.render import claim_loop

    def write(*_: object) -> None:
        raise temps.TempRemoved(tmp_path / "images" / "00000000-000.png")

    background = writer.BackgroundWriter(write, threads=1)
    background.submit(0, None, None, 0.0)  # type: ignore[arg-type]
    with pytest.raises(temps.TempRemoved):  # not "writing an image failed": nothing failed
        background.close()

    def overtaken(*_: object) -> None:
        background.close()

    monkeypatch.setattr(claim_loop, "generate", overtaken)
    state = RunState()
    state.jobfile = writer.JobFile(webdataset_runtime(tmp_path))
    jobfile = state.jobfile.path
    jobfile.write_text(json.dumps({"name": "w"}))
    with pytest.raises(temps.TempRemoved):  # not merged: another pod's clean-up took it; retried
        main.generate_all(None, None, state)  # type: ignore[arg-type]
    jobfile.write_text(json.dumps({"name": "w", "items": {"rendered": 1}}))
    with pytest.raises(NothingLeft, match="merged while this group wrote a duplicate"):
        main.generate_all(None, None, state)  # type: ignore[arg-type]


def test_the_clean_up_at_start_keeps_what_may_be_alive(tmp_path: Path) -> None:
    live = shards.ShardWriter(tmp_path, 1)  # this process, writing
    dead = tmp_path / f".shard-000002.tar.{temps._host()}-999999.tmp"
    fresh = tmp_path / ".shard-000003.tar.other-pod-17.tmp"
    old = tmp_path / ".shard-000004.tar.other-pod-17.tmp"
    for path in (dead, fresh, old):
        path.write_bytes(b"x")
    hour_ago = time.time() - temps.FOREIGN_STALE_SECONDS - 1
    os.utime(old, (hour_ago, hour_ago))
    assert sorted(temps.remove_stale_in([tmp_path])) == sorted([dead, old])
    assert live.close().is_file() and fresh.is_file()


def test_a_dead_writers_pid_taken_by_a_newer_process_does_not_keep_its_temp(tmp_path: Path) -> None:
    """A pod retried under the same host name: the dead writer's pid is another process now."""
    newer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        temp = tmp_path / f".shard-000005.tar.{temps._host()}-{newer.pid}.tmp"
        temp.write_bytes(b"partial")
        written = time.time() - 60  # the writer's last write, a minute before this process started
        os.utime(temp, (written, written))
        assert temps.remove_stale(tmp_path) == [temp]
        temp.write_bytes(b"partial")  # written by that process, now: its writer may be alive
        assert temps.remove_stale(tmp_path) == []
    finally:
        newer.communicate(b"")
