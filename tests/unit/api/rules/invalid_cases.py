"""One invalid manifest per API rule, with the field its message must name.

Shared by the CLI test (Python validation) and the cluster test (the CRD's CEL rules and
schema in the real API server), so both layers are held to the same rules.
"""

from __future__ import annotations

from typing import Any

from tests.builders import make_job

# (id, manifest, text the error must contain, checked by the API server too?)
INVALID_CASES: list[tuple[str, dict[str, Any], str, bool]] = [
    ("unknown-field", make_job().generation(stepz=3).obj(), "spec.generation.stepz", False),
    ("no-prompts", make_job().prompts().obj(), "spec.prompts", False),
    ("empty-prompt", make_job().prompts("ok", "  ").obj(), "spec.prompts", False),
    ("bad-dtype", make_job().set("spec.model.dtype", "float64").obj(), "spec.model.dtype", True),
    ("height-not-multiple-of-8", make_job().generation(height=100).obj(), "spec.generation.height", True),
    ("zero-steps", make_job().generation(steps=0).obj(), "spec.generation.steps", True),
    ("absolute-output-path", make_job().output(path="/data/x").obj(), "spec.output.path", True),
    ("dotdot-output-path", make_job().output(path="a/../../x").obj(), "spec.output.path", True),
    ("name-not-dns-label", make_job(name="Cats_1").obj(), "metadata.name", True),
    ("name-too-long-for-hostnames", make_job(name="a" * 60).world(nodes=120).obj(), "metadata.name", True),
    (
        "processes-not-one-per-gpu",
        make_job().world(gpus=4, processes=2).obj(),
        "spec.parallelism.processesPerNode",
        True,
    ),
    (
        "device-map-several-processes",
        make_job().device_map().world(gpus=4, processes=4).obj(),
        "spec.parallelism.processesPerNode",
        True,
    ),
    (
        "objective-without-auto",
        make_job().set("spec.parallelism.objective", "latency").obj(),
        "spec.parallelism.objective",
        True,
    ),
    (
        "auto-with-processes-and-gpus",
        make_job().set("spec.parallelism.strategy", "Auto").world(gpus=4, processes=4).obj(),
        "spec.parallelism.processesPerNode",
        True,
    ),
    (
        "cp-degree-does-not-divide",
        make_job().context_parallel(ulysses=4).world(gpus=6).obj(),
        "spec.parallelism.contextParallel",
        True,
    ),
    (
        "cp-degree-one",
        make_job().context_parallel(ulysses=1).world(gpus=2).obj(),
        "spec.parallelism.contextParallel",
        True,
    ),
    (
        "ring-with-native-backend",
        make_job().context_parallel(ring=2, ulysses=1).world(gpus=2).obj(),
        "spec.parallelism.contextParallel.attentionBackend",
        True,
    ),
    (
        "tp-degree-does-not-divide",
        make_job().tensor_parallel(degree=4).world(gpus=6).obj(),
        "spec.parallelism.tensorParallel",
        True,
    ),
    (
        "tp-on-cpu",
        make_job().tensor_parallel(degree=2).world(gpus=0, processes=2).obj(),
        "spec.parallelism.gpusPerNode",
        True,
    ),
    (
        "cp-and-tp-together",
        make_job()
        .context_parallel(ulysses=2)
        .world(gpus=2)
        .set("spec.parallelism.tensorParallel", {"degree": 2})
        .obj(),
        "spec.parallelism",
        True,
    ),
    (
        "cp-config-without-cp-strategy",
        make_job().world(gpus=2).set("spec.parallelism.contextParallel", {"ulyssesDegree": 2}).obj(),
        "spec.parallelism.contextParallel",
        True,
    ),
    (
        "cp-batched",
        make_job().context_parallel(ulysses=2).world(gpus=2).generation(batchSize=2).obj(),
        "spec.generation.batchSize",
        True,
    ),
    (
        "reserved-env-var",
        make_job().pod_template(env=[{"name": "PET_NNODES", "value": "9"}]).obj(),
        "spec.podTemplate.env",
        True,
    ),
    # Where data lives: a volume or a uri (object storage), credentials and endpoint with a uri only.
    (
        "dataset-volume-and-uri",
        make_job().prompts().set("spec.dataset", {"volume": {"emptyDir": {}}, "uri": "s3://b/rows.parquet"}).obj(),
        "spec.dataset",
        True,
    ),
    ("dataset-neither-volume-nor-uri", make_job().prompts().set("spec.dataset", {"path": "rows.jsonl"}).obj(),
     "spec.dataset", True),
    ("inputs-neither-volume-nor-uri", make_job().set("spec.inputs", {}).obj(), "spec.inputs", True),
    ("output-volume-and-uri", make_job().output(volume={"emptyDir": {}}, uri="s3://b/out").obj(), "spec.output",
     True),
    ("output-endpoint-without-uri", make_job().output(endpoint="http://minio:9000").obj(), "spec.output", True),
    ("output-uri-not-a-uri", make_job().output(uri="/mnt/out").obj(), "spec.output.uri", True),
    (
        "two-credentials-secrets",
        make_job().prompts().set("spec.dataset", {"uri": "s3://b/rows.parquet", "credentialsSecret": "data"})
        .output(uri="s3://b/out", credentialsSecret="results").obj(),
        "spec.output.credentialsSecret",
        True,
    ),
    (
        "compile-cache-other-secret",
        make_job().output(uri="s3://b/out", credentialsSecret="results")
        .set("spec.model.compileCache", {"uri": "s3://b/compile", "credentialsSecret": "compile"}).obj(),
        "spec.model.compileCache.credentialsSecret",
        True,
    ),
    ("compile-cache-not-a-uri", make_job().set("spec.model.compileCache", {"uri": "/mnt/compile"}).obj(),
     "spec.model.compileCache.uri", True),
    ("compile-cache-without-uri", make_job().set("spec.model.compileCache", {"endpoint": "http://minio:9000"}).obj(),
     "spec.model.compileCache.uri", True),
    ("bad-strategy", make_job().strategy("PipelineParallel").obj(), "spec.parallelism.strategy", True),
    ("negative-restarts", make_job().run_policy(maxRestarts=-1).obj(), "spec.runPolicy.maxRestarts", True),
    ("start-timeout-too-short", make_job().run_policy(startTimeoutSeconds=5).obj(),
     "spec.runPolicy.startTimeoutSeconds", True),
    ("start-timeout-over-a-day", make_job().run_policy(startTimeoutSeconds=86401).obj(),
     "spec.runPolicy.startTimeoutSeconds", True),
    (
        "cache-verify-sample-zero",
        make_job().generation(cache={"type": "FirstBlockCache", "verify": {"sample": 0}}).obj(),
        "spec.generation.cache.verify.sample",
        False,
    ),
    (
        "cache-verify-sample-not-a-percentage",
        make_job().generation(cache={"type": "FirstBlockCache", "verify": {"sample": "half"}}).obj(),
        "spec.generation.cache.verify.sample",
        False,
    ),
    (
        "cache-verify-ssim-above-one",
        make_job().generation(cache={"type": "FirstBlockCache", "verify": {"minSsim": 1.5}}).obj(),
        "spec.generation.cache.verify.minSsim",
        True,
    ),
    (
        "cache-verify-disable-without-threshold",
        make_job().generation(cache={"type": "FirstBlockCache", "verify": {"onFail": "DisableCache"}}).obj(),
        "spec.generation.cache.verify",
        True,
    ),
    (
        "workload-slices-without-a-queue",
        make_job().run_policy(workloadSlices=True).obj(),
        "spec.runPolicy.workloadSlices",
        True,
    ),
    (
        "workload-slices-with-a-required-topology",
        make_job().run_policy(queueName="gpus", workloadSlices=True)
        .pod_template(annotations={"kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"}).obj(),
        "spec.runPolicy.workloadSlices",
        True,
    ),
    (
        "checkpoint-every-zero-steps",
        make_job().run_policy(checkpoint={"everySteps": 0}).obj(),
        "spec.runPolicy.checkpoint.everySteps",
        True,
    ),
    (
        "checkpoint-with-a-step-cache",
        make_job().run_policy(checkpoint={"everySteps": 4}).generation(cache={"type": "FirstBlockCache"}).obj(),
        "spec.runPolicy.checkpoint: the step cache (generation.cache",
        True,
    ),
    (
        "checkpoint-of-a-batch",
        make_job().run_policy(checkpoint={"everySteps": 4}).generation(batchSize=2).obj(),
        "spec.runPolicy.checkpoint: holds one item's denoising state",
        True,
    ),
    (
        "checkpoint-of-an-inpainting-pipeline",
        make_job().run_policy(checkpoint={"everySteps": 4}).set("spec.model.pipeline", "FluxInpaintPipeline").obj(),
        "spec.runPolicy.checkpoint: FluxInpaintPipeline is not a pipeline whose resume from a checkpoint is verified "
        "exact",
        False,
    ),
    (
        "several-pods-on-the-default-output",
        make_job().world(nodes=2).drop("spec.output").obj(),
        "spec.output",
        True,
    ),
    (
        "several-pods-on-an-emptydir",
        make_job().world(nodes=2).output(volume={"emptyDir": {}}).obj(),
        "spec.output: spec.output.volume is an emptyDir",
        False,
    ),
    (
        "extra-args-set-what-the-spec-sets",
        make_job().generation(extraArgs={"num_inference_steps": 999}).obj(),
        "spec.generation.extraArgs.num_inference_steps: is set by the job, not by extraArgs; use spec.generation.steps",
        False,
    ),
    (
        "extra-args-set-an-items-noise",
        make_job().generation(extraArgs={"prompt": "x", "generator": None}).obj(),
        "spec.generation.extraArgs.generator",
        False,
    ),
]
