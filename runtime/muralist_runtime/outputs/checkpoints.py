"""An item's checkpoint in the output folder (runPolicy.checkpoint): written whole next to the item's output,
read back by whichever group renders the item next, removed once the item is written.

- `checkpoints/<key>.pt` (contract/output_folder.py names it): the denoising state (model/denoising.py's payload)
  in an envelope that says whose state it is: the item's request digest (requests.py: a changed request never
  resumes an old checkpoint), the pipeline, the step count and the torch and diffusers versions (another version
  may keep a scheduler's state otherwise). torch.save's format, loaded with weights_only (tensors and plain
  values, no code). Written through the folder's storage (storage.py): on a volume to a temp renamed into place
  (fsynced: it must outlive the node), in a bucket as one PUT: a reader finds the last whole checkpoint or none.
- `checkpoints/<key>.json`, the note: rewritten at each step's end (a small file, not fsynced: it only counts),
  how far the item's last render got and what its renders saved and lost before it (`Note`), so that the next
  render knows what a killed one lost (`resume_account`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muralist_api.contract import output_folder

from . import storage

log = logging.getLogger("muralist")

# The envelope's version: a checkpoint of another is not resumed (its item renders from its first step).
CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class Note:
    """How far an item's last render got (`step` steps done), and what its renders before it took from checkpoints
    (`saved`) and rendered again (`lost`), for the request it was made for."""

    request_digest: str
    step: int
    saved: int = 0
    lost: int = 0

    def to_json(self) -> str:
        return json.dumps({"requestDigest": self.request_digest, "step": self.step, "saved": self.saved,
                           "lost": self.lost})

    @classmethod
    def parse(cls, text: bytes | str) -> Note | None:
        try:
            doc = json.loads(text)
            return cls(str(doc["requestDigest"]), int(doc["step"]), int(doc.get("saved", 0)), int(doc.get("lost", 0)))
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class Account:
    """Where an item's render starts (`start` steps done: resumedFromStep when > 0), and the steps its renders
    took from checkpoints (`saved`, this one's start included) and rendered again (`lost`) so far."""

    start: int = 0
    saved: int = 0
    lost: int = 0

    def note(self, request_digest: str, step: int) -> Note:
        """The note this render writes once it has `step` steps done."""
        return Note(request_digest, step, self.saved, self.lost)

    def record(self) -> dict[str, int]:
        """The fields the item's record gets (none for an item that never stopped)."""
        fields = {"resumedFromStep": self.start, "stepsSaved": self.saved, "stepsLost": self.lost}
        return {name: value for name, value in fields.items() if value}


def resume_account(checkpoint_step: int | None, note: Note | None) -> Account:
    """An item's next render: it starts at its checkpoint's step (0 without one); what its last render reached
    past that (the note's step) was lost, on top of what the renders before lost; its start is saved, on top of
    what earlier resumes saved."""
    start = checkpoint_step or 0
    if note is None:
        return Account(start, start, 0)
    return Account(start, note.saved + start, note.lost + max(0, note.step - start))


def _path(root: Path, name: str) -> Path:
    return root / name


def write(root: Path, key: str, envelope: dict[str, Any], payload: dict[str, Any]) -> int:
    """The item's checkpoint, whole; returns its size in bytes."""
    import torch

    buf = io.BytesIO()
    torch.save({"envelope": {"format": CHECKPOINT_FORMAT, **envelope}, "state": payload}, buf)
    data = buf.getvalue()
    path = _path(root, output_folder.checkpoint_file(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.at(root).write(path, data)
    return len(data)


def read(root: Path, key: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The item's checkpoint (its envelope, its state), or None: none there, or one that cannot be read (a
    warning says why: the item renders from its first step)."""
    import torch

    path = _path(root, output_folder.checkpoint_file(key))
    try:
        data = storage.at(root).read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as e:  # the store's error now: the item renders exactly all the same, from its start
        log.warning("checkpoint %s cannot be read now (%s); item %s renders from its first step",
                    storage.at(root).where(path), e, key)
        return None
    try:
        doc = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        envelope, state = doc["envelope"], doc["state"]
        if not isinstance(envelope, dict) or not isinstance(state, dict):
            raise TypeError("not a checkpoint")
    except Exception as e:  # any unreadable file: the item renders from its start
        log.warning("checkpoint %s cannot be read (%s); item %s renders from its first step",
                    storage.at(root).where(path), e, key)
        return None
    if envelope.get("format") != CHECKPOINT_FORMAT:
        log.warning("checkpoint %s is of format %s, not %d; item %s renders from its first step",
                    storage.at(root).where(path), envelope.get("format"), CHECKPOINT_FORMAT, key)
        return None
    return envelope, state


def write_note(root: Path, key: str, note: Note) -> None:
    path = _path(root, output_folder.checkpoint_note_file(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.at(root).write(path, note.to_json().encode(), fsync=False)


def read_note(root: Path, key: str) -> Note | None:
    path = _path(root, output_folder.checkpoint_note_file(key))
    try:
        return Note.parse(storage.at(root).read_bytes(path))
    except FileNotFoundError:
        return None
    except OSError as e:  # only counts: the item renders all the same
        log.warning("checkpoint note %s cannot be read (%s)", storage.at(root).where(path), e)
        return None


def keys(root: Path) -> set[str]:
    """The items that have a checkpoint or a note in the folder (one listing)."""
    names = storage.at(root).names(root / output_folder.CHECKPOINTS_DIR)
    return {key for name in names if (key := output_folder.checkpoint_key(name)) is not None}


def remove(root: Path, key: str) -> None:
    """The item's checkpoint and note (its output is written)."""
    where = storage.at(root)
    for name in (output_folder.checkpoint_file(key), output_folder.checkpoint_note_file(key)):
        where.remove(_path(root, name))


def remove_all(root: Path) -> int:
    """Every checkpoint and note left in the folder (the merge: every item is done); how many items had some."""
    found = keys(root)
    for key in found:
        remove(root, key)
    with contextlib.suppress(OSError):  # the local folder (a volume's, or a bucket's staging), when empty
        (root / output_folder.CHECKPOINTS_DIR).rmdir()
    return len(found)
