"""The Dockerfile's shape, read with dockerfile-parse (no Docker needed): two targets, non-root
users, pinned base images from build arguments, what each image must run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

from tests.paths import REPO

dockerfile_parse = pytest.importorskip("dockerfile_parse")



@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str | None:
        values = [v for i, v in self.instructions if i == instruction]
        return values[-1] if values else None

    def all(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]


def parse() -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARGs (before the first FROM) and the stages by name."""
    parser = dockerfile_parse.DockerfileParser(str(REPO / "Dockerfile"))
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            words = value.split()  # IMAGE [AS NAME]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else words[0]
            current = stages[name] = Stage(base=words[0], name=name)
        elif instruction == "ARG" and current is None:
            key, _, default = value.partition("=")
            global_args[key] = default
        elif current is not None and instruction != "COMMENT":
            current.instructions.append((instruction, value))
    return global_args, stages


GLOBAL_ARGS, STAGES = parse()


def test_both_targets_exist() -> None:
    assert {"operator", "runtime"} <= STAGES.keys()


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_base_image_comes_from_a_pinned_build_arg(target: str) -> None:
    match = re.fullmatch(r"\$\{?(\w+)\}?", STAGES[target].base)
    assert match, f"{target}: FROM {STAGES[target].base} is not a build argument"
    default = GLOBAL_ARGS[match.group(1)]
    assert ":" in default or "@sha256:" in default, f"{match.group(1)}={default} has no tag"
    assert not default.endswith(":latest")


def test_no_latest_tags_anywhere() -> None:
    assert ":latest" not in (REPO / "Dockerfile").read_text()


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_final_user_is_uid_1000(target: str) -> None:
    user = STAGES[target].last("USER")
    assert user is not None and user.split(":")[0] == "1000", f"{target}: USER {user}"


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_entrypoint_is_the_muralist_cli(target: str) -> None:
    assert json.loads(STAGES[target].last("ENTRYPOINT") or "null") == ["muralist"]


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_each_image_installs_its_lock_with_hashes_then_ours_without_dependencies(target: str) -> None:
    stage = STAGES[target]
    assert stage.all("COPY") == [f"locks/{target}.txt /opt/venv/lock.txt"]
    installs = stage.all("RUN")
    assert "pip install --require-hashes -r /opt/venv/lock.txt" in installs
    ours = next(run for run in installs if "/src/api" in run)
    assert ours.endswith("pip install --no-deps /src/api /src"), ours
    assert installs.index("pip install --require-hashes -r /opt/venv/lock.txt") < installs.index(ours)


def _pinned(lock: str) -> set[str]:
    return {line.split("==")[0].lower() for line in (REPO / "locks" / lock).read_text().splitlines() if "==" in line}


def test_operator_has_no_torch() -> None:
    assert "kopf" in _pinned("operator.txt")
    assert not {"torch", "diffusers", "transformers"} & _pinned("operator.txt")


def test_runtime_has_torchrun_and_a_writable_model_cache() -> None:
    runtime = STAGES["runtime"]
    installs = " ".join(runtime.all("RUN"))
    assert {"torch", "diffusers", "transformers", "accelerate"} <= _pinned("runtime.txt")
    env = " ".join(runtime.all("ENV"))
    # torchrun and `python -m muralist_runtime` come from the venv, which is first on PATH.
    assert "PATH=/opt/venv/bin:" in env
    assert "HF_HOME=/var/cache/huggingface" in env
    assert 'chown 1000:1000 "$HF_HOME"' in installs


def test_only_the_runtime_has_a_compiler_for_torch_compile() -> None:
    # generation.compile builds kernels in the pod (inductor's C++ on a CPU, Triton's launcher on a GPU):
    # tests/e2e/test_runtime_image.py compiles in the built image.
    assert "image-base.sh --compiler" in " ".join(STAGES["runtime"].all("RUN"))
    assert "--compiler" not in " ".join(STAGES["operator"].all("RUN"))


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_extra_ca_is_optional_and_used_by_pip(target: str) -> None:
    stage = STAGES[target]
    assert any("--mount=type=secret,id=extra_ca" in run for run in stage.all("RUN"))
    assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in " ".join(stage.all("ENV"))


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"  # an allowlist: everything else stays out (.git, venvs, outputs)
    for needed in ("!pyproject.toml", "!cli/", "!operator/", "!runtime/", "!hack/image-base.sh", "!locks/operator.txt",
                   "!locks/runtime.txt"):
        assert needed in lines
