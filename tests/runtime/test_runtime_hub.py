"""The hub path: models and adapters named by hub id, through the real `huggingface_hub` client.

tests/hub_server.py serves the tiny Flux as a hub repo under two commits (the older one with
other transformer weights, so the loaded revision shows in the pixels), a gated copy that
needs a token, and a tiny LoRA repo (tag `v1`, and a `main` whose LoRA differs). Every hub call
of the runtime (resolve, staging, from_pretrained, load_lora_weights, the context-parallel
pre-flight) goes to it through HF_ENDPOINT.

The hub's refusals are checked in this process, against the runtime's own functions (the
client reads the cache directory at each call, so each test gets a fresh one); what only a
whole run shows (exit codes, the termination message, two ranks or two pods downloading,
a download cut and fetched again) runs under real torchrun, four spawns in all.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from muralist_api import contract
from muralist_api.contract import PermanentFailure
from muralist_api.job import Generation
from muralist_api.options import Adapter
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime.model import features, hub, loading, preflight, resolve, staging

from tests.hub_server import HubServer

from .conftest import make_job, render_in_process, runtime_spec_json, torchrun

TOKEN = "hf_muralist_test_token"
NO_ACCESS = "hf_token_without_access"  # a token the hub knows, whose account has no access to gated repos
MODEL = "muralist-test/tiny-flux"
GATED = "muralist-test/tiny-flux-gated"
LORA = "muralist-test/tiny-lora"
LORA_FILE = "style.safetensors"  # not diffusers' default name: the adapter must say weightName
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"
NO_SUCH_REPO = "muralist-test/no-such-repo"


@dataclass
class Repos:
    server: HubServer
    old: Path  # the model's older commit (its transformer's output layer negated)
    old_sha: str
    lora_v1: Path  # the LoRA at tag v1; main's has its B matrices negated
    lora_v1_sha: str


def _negated(src: Path, dst: Path, which: Any) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(src)
    save_file({k: -v if which(k) else v for k, v in tensors.items()}, dst, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def repos(hub_server: HubServer, tiny_model: Path, tiny_lora: Path, tmp_path_factory: pytest.TempPathFactory) -> Repos:
    root = tmp_path_factory.mktemp("hub-repos")
    old = root / "tiny-flux-old"
    shutil.copytree(tiny_model, old)
    _negated(tiny_model / WEIGHTS, old / WEIGHTS, lambda k: k.startswith("proj_out."))
    lora_v1, lora_main = root / "lora-v1", root / "lora-main"
    lora_v1.mkdir()
    lora_main.mkdir()
    shutil.copy(tiny_lora / "pytorch_lora_weights.safetensors", lora_v1 / LORA_FILE)
    _negated(lora_v1 / LORA_FILE, lora_main / LORA_FILE, lambda k: ".lora_B." in k)
    old_sha, _ = hub_server.add_repo(MODEL, [old, tiny_model])
    hub_server.add_repo(GATED, [old, tiny_model], gated=True)
    lora_v1_sha, _ = hub_server.add_repo(LORA, [lora_v1, lora_main], tags={"v1": 0})
    hub_server.tokens.update({TOKEN: True, NO_ACCESS: False})
    return Repos(hub_server, old, old_sha, lora_v1, lora_v1_sha)


@pytest.fixture
def repo(repos: Repos) -> Iterator[Repos]:
    """The repos, with the server's request log and faults cleared before and after."""
    repos.server.reset()
    yield repos
    repos.server.reset()


@pytest.fixture
def hf_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh hub cache for this process's hub calls (the client reads it at each call), no token."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return cache


def runtime(model: dict[str, Any]) -> RuntimeSpec:
    job = make_job().obj()
    job["model"] = {"dtype": "float32", **model}
    return RuntimeSpec.model_validate({"name": "t", "spec": job, "outputDir": "/unused"})


def hub_env(runtime_env: dict[str, str], tmp_path: Path, token: str | None = None) -> dict[str, str]:
    """A spawned run's environment: online (to the stand-in), its own HF_HOME, HF_TOKEN if given."""
    env = {**runtime_env, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    env.pop("HF_TOKEN", None)
    return env | ({"HF_TOKEN": token} if token else {})


def max_diff(a: Any, b: Any) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


# -- the hub's refusals, in this process -----------------------------------------------------------


@pytest.mark.parametrize(("name", "revision", "token", "field", "words"), [
    pytest.param(GATED, None, None, "spec.model.tokenSecret", "is a gated repo and the pod has no hub token",
                 id="gated-without-token"),
    pytest.param(GATED, None, NO_ACCESS, "spec.model.tokenSecret", "the token's account has no access",
                 id="gated-token-without-access"),
    pytest.param(GATED, None, "hf_unknown", "spec.model.tokenSecret", "the hub refused the token",
                 id="unknown-token"),
    pytest.param(NO_SUCH_REPO, None, None, "spec.model.name", "is no repo on the hub", id="no-such-repo"),
    pytest.param(MODEL, "no-such-branch", None, "spec.model.revision", "has no branch, tag or commit 'no-such-branch'",
                 id="no-such-revision"),
    pytest.param(LORA, None, None, "spec.model.name", "has no file 'model_index.json'", id="not-a-pipeline"),
])
def test_a_refusal_of_the_hub_fails_at_resolve_naming_the_field(repo: Repos, hf_cache: Path,
                                                                monkeypatch: pytest.MonkeyPatch, name: str,
                                                                revision: str | None, token: str | None, field: str,
                                                                words: str) -> None:
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(PermanentFailure) as e:
        resolve.resolve_model(runtime({"name": name, **({"revision": revision} if revision else {})}))
    assert e.value.field == field
    assert words in str(e.value)
    assert len(repo.server.seen(name)) == 1, "refused at the first request, never retried"


def test_staging_and_loading_name_the_same_fields(repo: Repos, hf_cache: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.MURALIST_STAGE_DIR, str(tmp_path / "stage"))
    with pytest.raises(PermanentFailure) as e:
        staging.stage_model(GATED, None, local_rank=0)
    assert e.value.field == hub.TOKEN_FIELD
    assert not [p for p in (tmp_path / "stage").iterdir() if not p.name.endswith(".lock")], "no copy left"
    spec = runtime({"name": MODEL})
    for name, revision, field in [(GATED, None, "spec.model.tokenSecret"),
                                  (MODEL, "no-such-branch", "spec.model.revision"),
                                  (NO_SUCH_REPO, None, "spec.model.name")]:
        with pytest.raises(PermanentFailure) as e:
            loading.load_pipeline(spec, name, revision)
        assert e.value.field == field, str(e.value)


def test_a_hub_adapter_loads_at_its_revision_and_each_refusal_names_its_field(repo: Repos, hf_cache: Path,
                                                                              tiny_model: Path) -> None:
    pipe = loading.load_pipeline(runtime({"name": MODEL}), str(tiny_model), None)
    line = features.load_adapters(pipe, [Adapter(name=LORA, weight_name=LORA_FILE, revision="v1")], fuse=False)
    assert line == f"LoRA adapters: {LORA} x1"
    fetched = [r for r in repo.server.seen(LORA) if r.kind == "resolve"]
    assert fetched and {(r.revision, r.file) for r in fetched} <= {("v1", LORA_FILE), (repo.lora_v1_sha, LORA_FILE)}
    pipe.unload_lora_weights()
    cases = [(Adapter(name=LORA, weight_name="missing.safetensors", revision="v1"), "weightName", "has no file "
              "'missing.safetensors' at revision v1"),
             (Adapter(name=LORA, weight_name=LORA_FILE, revision="v9"), "revision", "no branch, tag or commit 'v9'"),
             (Adapter(name=NO_SUCH_REPO, weight_name=LORA_FILE), "name", "is no repo on the hub")]
    for adapter, field, words in cases:
        with pytest.raises(PermanentFailure) as e:
            features.load_adapters(pipe, [adapter], fuse=False)
        assert (e.value.field, words in str(e.value)) == (f"spec.model.adapters[0].{field}", True), str(e.value)
    # A download that keeps failing (main's file is not in the cache yet) is the network's fault,
    # not the adapter's: retried with the pod.
    repo.server.drop(count=100, after_bytes=0)
    with pytest.raises(Exception) as e:
        features.load_adapters(pipe, [Adapter(name=LORA, weight_name=LORA_FILE)], fuse=False)
    assert not isinstance(e.value, PermanentFailure), e.value
    assert any(r.dropped for r in repo.server.seen(LORA))


def test_the_context_parallel_preflight_reads_the_configs_from_the_hub(repo: Repos, hf_cache: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)

    def verdict(text_tokens: int) -> Any:
        generation = Generation(steps=2, height=32, width=32, extraArgs={"max_sequence_length": text_tokens})
        return preflight.check_context_parallel(GATED, repo.old_sha, generation, None, 1, 2, allow_uneven=False)

    assert verdict(16).problems == []
    # Flux's _cp_plan splits the text tokens too (the transformer's config names the class):
    # Ulysses 2 cannot split 15 of them. Without the configs the pre-flight has nothing to say.
    assert verdict(15).problems, "the transformer's and the VAE's configs were read"
    read = {r.file for r in repo.server.seen(GATED) if r.kind == "resolve"}
    assert {"transformer/config.json", "vae/config.json"} <= read
    assert {(r.revision, r.authorization) for r in repo.server.seen(GATED)} == {(repo.old_sha, f"Bearer {TOKEN}")}


# -- whole runs under torchrun ---------------------------------------------------------------------


@pytest.mark.torchrun
def test_a_pinned_revision_of_a_gated_model_and_a_hub_adapter_load_with_the_token(
        repo: Repos, tmp_path: Path, runtime_env: dict[str, str], tiny_model: Path) -> None:
    out = tmp_path / "out"
    job = make_job().processes(2).context_parallel(ulysses=2).obj()
    job["prompts"] = job["prompts"][:2]
    job["model"] = {"name": GATED, "revision": repo.old_sha, "dtype": "float32",
                    "tokenSecret": {"name": "hf", "key": "token"},
                    "adapters": [{"name": LORA, "weightName": LORA_FILE, "revision": "v1"}]}
    repo.server.drop(1, file=WEIGHTS)  # cut once mid-file: the client downloads it again
    run = torchrun(runtime_spec_json(job, out), out, hub_env(runtime_env, tmp_path, TOKEN), 2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "HTTP Request:" not in run.stderr, "the client's request lines stay out of the pod's log"

    local = {**job, "model": {"name": "muralist/tiny-flux", "dtype": "float32",
                              "adapters": [{"name": str(repo.lora_v1 / LORA_FILE)}]}}
    pinned, main = render_in_process(local, repo.old), render_in_process(local, tiny_model)
    for key, expected in pinned.items():
        assert max_diff(run.pixels(key), expected.pixels()) <= 1, "the pinned commit and the v1 adapter loaded"
    assert max(max_diff(run.pixels(key), image.pixels()) for key, image in main.items()) > 20, "not main's"

    model, adapter = repo.server.seen(GATED), repo.server.seen(LORA)
    assert {r.revision for r in model if r.kind != "cdn"} == {repo.old_sha}, "every model request at the pin"
    hub_requests = [r for r in model + adapter if r.kind != "cdn"]
    assert {r.authorization for r in hub_requests} == {f"Bearer {TOKEN}"}, "the token reached every hub request"
    assert {r.authorization for r in repo.server.seen(kind="cdn")} == {None}, "and nothing else"
    cut = [r.dropped for r in repo.server.downloads(GATED) if r.file == WEIGHTS]
    assert cut == [True, False], "downloaded once more after the cut, once for both ranks"


@pytest.mark.torchrun
def test_staging_downloads_each_file_once_for_two_pods_on_a_node(repo: Repos, tmp_path: Path,
                                                                 runtime_env: dict[str, str], tiny_model: Path) -> None:
    out = tmp_path / "out"
    job = make_job().processes(1, nodes=2).obj()
    job["prompts"] = job["prompts"][:2]
    job["model"] = {"name": MODEL, "dtype": "float32", "loading": {"stage": True}}
    env = {**hub_env(runtime_env, tmp_path), contract.MURALIST_STAGE_DIR: str(tmp_path / "stage")}
    pods = [{"HF_HOME": str(tmp_path / f"hf-pod{i}")} for i in range(2)]  # each pod its own cache, one stage dir
    run = torchrun(runtime_spec_json(job, out), out, env, 1, nnodes=2, node_env=pods)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(run.manifest()) == 2
    assert run.stderr.count("muralist.stage: staged ") == 1, "one pod copies"
    fetched = Counter(r.file for r in repo.server.downloads(MODEL))
    # Each pod's resolve step checks the repo with model_index.json before its world starts.
    assert fetched.pop("model_index.json") == 2
    contents = {hashlib.sha256(p.read_bytes()).digest() for p in tiny_model.rglob("*")
                if p.is_file() and p.name != "model_index.json"}
    assert set(fetched.values()) == {1} and len(fetched) == len(contents), "every other file once for the node"


@pytest.mark.torchrun
def test_a_gated_model_without_a_token_fails_at_once_naming_token_secret(repo: Repos, tmp_path: Path,
                                                                         runtime_env: dict[str, str]) -> None:
    out = tmp_path / "out"
    job = make_job().obj()
    job["model"] = {"name": GATED, "dtype": "float32"}
    run = torchrun(runtime_spec_json(job, out), out, hub_env(runtime_env, tmp_path), 1)
    assert run.returncode == contract.PERMANENT_FAILURE_EXIT_CODE, run.stderr[-3000:]
    assert run.termination["permanent"] is True
    assert run.termination["message"].startswith(f"spec.model.tokenSecret: {GATED} is a gated repo")
    assert run.stderr.count("muralist: spec.model.tokenSecret: ") == 1
    assert "huggingface_hub.errors" not in run.stderr and "GatedRepoError" not in run.stderr, "no hub traceback"
    assert [(r.kind, r.status) for r in repo.server.seen(GATED)] == [("resolve", 401)], "refused once, at resolve"


@pytest.mark.torchrun
def test_a_persistent_network_failure_is_retryable_not_permanent(repo: Repos, tmp_path: Path,
                                                                 runtime_env: dict[str, str]) -> None:
    out = tmp_path / "out"
    job = make_job().obj()
    job["model"] = {"name": MODEL, "dtype": "float32"}
    repo.server.drop(count=1000, after_bytes=0)  # every download cut before its first byte
    start = time.monotonic()
    run = torchrun(runtime_spec_json(job, out), out, hub_env(runtime_env, tmp_path), 1)
    elapsed = time.monotonic() - start
    assert run.returncode == contract.EXIT_RETRYABLE, run.stderr[-3000:]
    assert (run.termination["permanent"], run.termination["reason"]) == (False, "Error")
    assert "RemoteProtocolError" in run.termination["message"]
    tries = [r for r in repo.server.downloads(MODEL) if r.file == "model_index.json"]
    assert len(tries) > 1 and all(r.dropped for r in tries), "the client retried (huggingface_hub 2.4: 5 times)"
    assert elapsed < 150, f"took {elapsed:.0f}s"
    print(f"persistent failure: exit 1 after {elapsed:.1f}s")
