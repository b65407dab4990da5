"""`muralist run`: manifest checks, runtime spec, the launcher contract, exit codes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from muralist_api import contract
from muralist_api.rules.problems import ValidationProblem
from muralist_api.runtime_spec import RuntimeSpec
from muralist_runtime import local

from tests.builders import SHARED_OUTPUT
from tests.paths import REPO


def args(manifest: Path, **kw) -> argparse.Namespace:
    return argparse.Namespace(manifest=str(manifest), output=kw.get("output"),
                              model=kw.get("model"), prompts_file=kw.get("prompts_file"))


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "muralist.dev/v1alpha1", "kind": "DiffusionJob",
                                    "metadata": {"name": "j"}, "spec": spec}))
    return path


def test_invalid_manifest_prints_every_problem(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, {"model": {"name": "m"}, "prompts": ["a"],
                            "generation": {"stepz": 3, "height": 30}})
    assert local.run_local(args(path)) == 1
    err = capsys.readouterr().err
    assert "spec.generation.stepz: unknown field" in err
    assert "spec.generation.height" in err
    assert "Traceback" not in err


def test_prompts_from_needs_its_config_map_or_a_prompts_file(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, {"model": {"name": "m"},
                            "promptsFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}})
    assert local.run_local(args(path)) == 1
    err = capsys.readouterr().err
    assert "ConfigMap 'c'" in err and "--prompts-file" in err
    assert err.count(str(path)) == 1, "the file is named once"


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_run_reads_every_file_validate_accepts(example: str, tmp_path: Path) -> None:
    # One reader: `muralist run` takes the DiffusionJob of each example (and serves a promptsFrom
    # ConfigMap found in the same file from a local file).
    job, manifest = local.load_job(str(REPO / "examples" / example))
    prompts = local.prompts_file_for(job, manifest, None, tmp_path)
    if job.spec.prompts_from is not None:
        ref = job.spec.prompts_from.config_map_key_ref
        assert Path(prompts).read_text() == manifest.config_map_value(ref.name, ref.key)
        assert len(Path(prompts).read_text().splitlines()) == 3
    else:
        assert prompts is None


def test_a_file_with_two_jobs_is_refused_with_their_names(tmp_path: Path) -> None:
    one = yaml.safe_load((REPO / "examples" / "quickstart-cpu.yaml").read_text())
    two = {**one, "metadata": {"name": "second"}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([one, two]))
    with pytest.raises(ValidationProblem) as err:
        local.load_job(str(path))
    assert err.value.problems == [f"{path}: holds 2 DiffusionJobs (quickstart, second); muralist run takes one: "
                                  "put each in its own file"]


def test_runtime_spec_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job, _ = local.load_job(str(REPO / "examples" / "quickstart-cpu.yaml"))
    spec = local.runtime_spec(job, None, "model-dir", None)
    assert spec.output_dir == str(tmp_path / "muralist-output" / "quickstart")
    assert spec.model_path == str(tmp_path / "model-dir")
    # What the runtime reads back.
    assert RuntimeSpec.model_validate_json(spec.model_dump_json(by_alias=True)) == spec


def test_quickstart_example_is_a_small_cpu_job() -> None:
    job, _ = local.load_job(str(REPO / "examples" / "quickstart-cpu.yaml"))
    par = job.spec.parallelism
    assert (job.spec.model.name, par.strategy, par.gpus_per_node, par.world_size) == (
        "muralist/tiny-shapes-flux", "DataParallel", 0, 2)
    assert job.total_images == 16


def spec_for(parallelism: dict) -> RuntimeSpec:
    return RuntimeSpec.model_validate({"name": "j", "outputDir": "/o", "spec": {
        "model": {"name": "m"}, "prompts": ["a"], "parallelism": parallelism, "output": SHARED_OUTPUT}})


def launched(runtime: RuntimeSpec, tmp_path: Path) -> list[tuple[list[str], dict[str, str]]]:
    """What each local agent's launch entry point starts: the launcher argv and its PET_* env."""
    from muralist_runtime import launch

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(runtime.model_dump_json(by_alias=True))
    agents = local.agent_commands(runtime, str(spec_file), 12345, 23456)
    for argv, env in agents:
        assert argv[1:] == ["-m", "muralist_runtime.launch", "--spec", str(spec_file)]
        assert env[contract.MURALIST_CLAIMS_ADDR] == "127.0.0.1:23456"
    return [launch.agent_command(str(spec_file), env) for _argv, env in agents]


def test_each_agent_is_its_own_torchrun_world(tmp_path: Path) -> None:
    runs = launched(spec_for({"nodes": 2, "gpusPerNode": 0, "processesPerNode": 3}), tmp_path)
    for node, (argv, pet) in enumerate(runs):
        assert argv[1:4] == ["-m", "muralist_runtime.agent", "torch.distributed.run"]
        # Pods never rendezvous: a world of one pod each (on one machine, a port each).
        assert pet == {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "3", "PET_NODE_RANK": "0",
                       "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(12345 + node)}


def test_a_context_parallel_group_over_two_pods_is_one_world(tmp_path: Path) -> None:
    spec = spec_for({"nodes": 4, "gpusPerNode": 0, "processesPerNode": 2, "strategy": "ContextParallel",
                     "contextParallel": {"ulyssesDegree": 4}})
    runs = launched(spec, tmp_path)
    assert [(pet["PET_NNODES"], pet["PET_NODE_RANK"], pet["PET_MASTER_PORT"]) for _, pet in runs] == [
        ("2", "0", "12345"), ("2", "1", "12345"), ("2", "0", "12346"), ("2", "1", "12346")]


def test_accelerate_on_cpu_uses_multi_gpu_for_several_processes(tmp_path: Path) -> None:
    ((argv, _pet),) = launched(spec_for({"gpusPerNode": 0, "processesPerNode": 2, "launcher": "accelerate"}),
                               tmp_path)
    assert argv[1:4] == ["-m", "muralist_runtime.agent", "accelerate.commands.launch"]
    # accelerate starts one process on CPU without --multi_gpu, and refuses it with --cpu.
    assert "--multi_gpu" in argv and "--cpu" not in argv
    assert argv[argv.index("--num_processes") + 1] == "2"
    assert argv[argv.index("--main_process_ip") + 1] == "127.0.0.1"
    assert argv[-4:-1] == ["-m", "muralist_runtime", "--spec"]
    ((one, _pet),) = launched(spec_for({"gpusPerNode": 0, "processesPerNode": 1, "launcher": "accelerate"}),
                              tmp_path)
    assert "--cpu" in one and "--multi_gpu" not in one


@pytest.mark.parametrize(
    ("codes", "doc", "expected"),
    [
        ([0], {"permanent": False}, 0),
        ([1, 0], {"permanent": True, "exitCode": 78}, 78),
        ([0, 1], {"permanent": False, "exitCode": 1}, 1),
        ([1], None, 1),
    ],
)
def test_exit_code_from_termination_message(tmp_path: Path, codes, doc, expected) -> None:
    path = tmp_path / "t"
    if doc is not None:
        path.write_text(json.dumps(doc))
    assert local.verdict(codes, path) == expected


def test_missing_inline_inputs_are_refused_before_anything_starts(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "in" / "photos").mkdir(parents=True)
    (tmp_path / "in" / "photos" / "a.png").write_bytes(b"any bytes: only the file's presence is checked here")
    path = write(tmp_path, {
        "model": {"name": "muralist/tiny-flux", "pipeline": "FluxInpaintPipeline"},
        "inputs": {"volume": {"hostPath": {"path": str(tmp_path / "in")}}},
        "prompts": [{"text": "a", "image": "photos/a.png"}, "b",
                    {"text": "c", "image": "photos/x.png", "mask": "masks/m.png"}],
    })
    monkeypatch.setattr(local, "_start_agents", lambda *a: pytest.fail("started agents"))
    assert local.run_local(args(path, output=str(tmp_path / "out"))) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"spec.prompts[2].image: 'photos/x.png' not found in spec.inputs.volume ({tmp_path / 'in'})",
                   f"spec.prompts[2].mask: 'masks/m.png' not found in spec.inputs.volume ({tmp_path / 'in'})"]


def test_the_output_may_be_a_uri_staged_locally(tmp_path: Path) -> None:
    job = local.load_job(write(tmp_path, {"model": {"name": "muralist/tiny-flux"}, "prompts": ["x"],
                                          "output": {"uri": "s3://results/runs", "path": "a"}}))[0]
    assert local.output_location(job, None, tmp_path) == (str(tmp_path / "output"), "s3://results/runs/a")
    assert local.output_location(job, "gs://other/x/", tmp_path) == (str(tmp_path / "output"), "gs://other/x")
    assert local.output_location(job, str(tmp_path / "here"), tmp_path) == (str(tmp_path / "here"), None)


def test_local_ports_are_free_and_below_the_ephemeral_range() -> None:
    # An outgoing connection takes its source port from the ephemeral range: a port picked there
    # and released could be taken before the run's store listens on it.
    import socket

    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for nodes in (1, 3):
        first, claims = local.local_ports(nodes)
        assert claims == first + nodes
        assert first >= local.LISTEN_PORTS_FROM and claims < start
        for port in range(first, claims + 1):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
