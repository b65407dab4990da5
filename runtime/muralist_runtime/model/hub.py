"""The Hugging Face Hub's answers, classified in one place for every hub call of the runtime.

A model or adapter named by hub id is fetched in four places: `resolve.resolve_model`
(model_index.json, before the world exists, so a refusal fails the pod at once), staging
(`snapshot_download`), `from_pretrained` and `load_lora_weights`. Each wraps its call in
`hub_errors(...)` (adapters call `permanent`). diffusers wraps the client's errors in its own
(an OSError "Cannot load model ..." raised from the hub's error, or a cache miss after it fell
back to the local cache), so the decision reads the whole chain of causes.

What retrying cannot change becomes a PermanentFailure (exit 78) naming the field to fix:
- a gated repo without a token, a token without access to it, a token the hub refuses (401,
  403): `spec.model.tokenSecret`;
- a repo the hub does not know (a private repo answers the same without a token): the name;
- a revision that does not exist: the revision;
- a file that does not exist (an adapter's weightName, a model without model_index.json).
Everything else stays retryable (exit 1): connections refused, cut or timed out, 5xx and 429
answers. The client has already retried those itself (a cut download resumes up to 5 times,
metadata calls back off), so the pod fails and the Job tries again later.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from muralist_api.contract import PermanentFailure
from muralist_api.contract.env import PodEnv

TOKEN_FIELD = "spec.model.tokenSecret"


@dataclass(frozen=True)
class HubFields:
    """The spec fields that name one hub download: the repo, its revision, the file."""

    name: str
    revision: str
    entry: str | None  # None: a missing file is the caller's to handle (a config it can do without)


MODEL = HubFields("spec.model.name", "spec.model.revision", "spec.model.name")


def adapter_fields(index: int) -> HubFields:
    field = f"spec.model.adapters[{index}]"
    return HubFields(f"{field}.name", f"{field}.revision", f"{field}.weightName")


def token() -> str | None:
    """The pod's hub token (model.tokenSecret reaches the pod only as HF_TOKEN)."""
    return PodEnv.from_environ().hf_token


def causes(error: BaseException) -> Iterator[BaseException]:
    """The error, then what it was raised from, as Python prints the chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def permanent(error: BaseException, repo: str, revision: str | None, fields: HubFields) -> PermanentFailure | None:
    """The PermanentFailure for a hub answer that retrying cannot change, or None (retryable)."""
    from huggingface_hub import errors

    for cause in causes(error):
        status = getattr(getattr(cause, "response", None), "status_code", None)
        if isinstance(cause, errors.GatedRepoError):
            if status == 403:
                return PermanentFailure(TOKEN_FIELD, f"{repo} is a gated repo and the token's account has no access "
                                        "to it: accept its terms on the hub with that account, or use another token")
            return PermanentFailure(TOKEN_FIELD, f"{repo} is a gated repo and the pod has no hub token: set "
                                    "model.tokenSecret to a Secret key holding the token of an account with access")
        if isinstance(cause, errors.RepositoryNotFoundError | errors.DisabledRepoError):
            why = "is disabled on the hub" if isinstance(cause, errors.DisabledRepoError) else (
                "is no repo the token can read" if token() else
                "is no repo on the hub (a private repo answers the same without a token: then set model.tokenSecret)")
            return PermanentFailure(fields.name, f"{repo!r} {why}")
        if isinstance(cause, errors.RevisionNotFoundError):
            return PermanentFailure(fields.revision, f"{repo} has no branch, tag or commit {revision!r}")
        if isinstance(cause, errors.RemoteEntryNotFoundError):
            if fields.entry is None:
                return None
            return PermanentFailure(fields.entry, f"{repo} has no file {_file_of(cause) or '(unknown)'!r} at "
                                    f"revision {revision or 'main'}")
        if isinstance(cause, errors.HfHubHTTPError) and status in (401, 403):
            what = "refused the token" if token() else "asks for a token"
            return PermanentFailure(TOKEN_FIELD, f"the hub {what} for {repo} ({status}): check model.tokenSecret "
                                    "and the Secret's value")
    return None


@contextmanager
def hub_errors(repo: str, revision: str | None, fields: HubFields) -> Iterator[None]:
    """Raise the hub's permanent answers inside the block as PermanentFailure; the rest as they are."""
    try:
        yield
    except PermanentFailure:
        raise
    except Exception as e:
        failure = permanent(e, repo, revision, fields)
        if failure is None:
            raise
        raise failure from None


def _file_of(error: BaseException) -> str | None:
    """The repo file a refused `.../resolve/<revision>/<file>` request asked for."""
    response = getattr(error, "response", None)
    url = str(getattr(response, "url", "") or "")
    _, found, rest = urlsplit(url).path.partition("/resolve/")
    return unquote(rest.split("/", 1)[1]) if found and "/" in rest else None
