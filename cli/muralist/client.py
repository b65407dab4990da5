"""`Client`: DiffusionJobs through the Kubernetes API, for notebooks, pipelines and `muralist submit`.

Built on the official kubernetes client, with the kubeconfig (or the pod's service account
inside a cluster). Jobs go in checked by `muralist validate`'s rules; statuses come back typed
(`muralist_api.status.DiffusionJobStatus`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from muralist_api.job import GROUP, PLURAL, VERSION, DiffusionJob
from muralist_api.status import DiffusionJobStatus, Phase

from muralist import follow as following
from muralist import results as outputs
from muralist.errors import JobFailed
from muralist.job_input import JobInput, submission
from muralist.progress_bar import ProgressBar


def _options(job: DiffusionJob, given: dict[str, Any] | None) -> dict[str, Any] | None:
    """fsspec options for the job's output: those given, else its endpoint (an S3-compatible store)."""
    if given is not None or job.spec.output.uri is None:
        return given
    return job.spec.output.options()


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
HTTP_CONFLICT = 409


def connect(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> tuple[Any, str]:
    """A kubernetes ApiClient and its default namespace: from `kubeconfig` (else $KUBECONFIG or
    ~/.kube/config) and `context`, or, where there is no kubeconfig, the pod's in-cluster config."""
    from kubernetes import client, config
    try:
        contexts, active = config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
    except config.ConfigException as no_kubeconfig:
        if kubeconfig is not None or context is not None:
            raise
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as not_in_a_pod:
            raise config.ConfigException(f"no kubeconfig ({no_kubeconfig}) and not in a pod ({not_in_a_pod}); "
                                         "pass --kubeconfig or set KUBECONFIG") from None
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else ""
        return client.ApiClient(configuration), namespace or "default"
    chosen = next((c for c in contexts if c["name"] == context), None) if context else active
    if chosen is None:
        raise ValueError(f"no context {context!r} in the kubeconfig")
    api = config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None, context=chosen["name"])
    return api, chosen.get("context", {}).get("namespace") or "default"


class Client:
    """DiffusionJobs of one namespace (the kubeconfig context's by default).

    `api_client` is a kubernetes ApiClient to use instead of loading a configuration.
    """

    def __init__(
        self,
        namespace: str | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        api_client: Any = None,
    ):
        from kubernetes import client

        default_namespace = "default"
        if api_client is None:
            api_client, default_namespace = connect(kubeconfig, context)
        self.api_client = api_client
        self.namespace = namespace or default_namespace
        self._namespace_chosen = namespace is not None
        # Any: the generated clients type bodies as their models, and a DiffusionJob has none.
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._core: Any = client.CoreV1Api(api_client)

    # --- the objects -----------------------------------------------------------------------

    def create(self, job: JobInput) -> DiffusionJob:
        """Create a DiffusionJob from a manifest path, YAML text, a dict or a `DiffusionJob`,
        after `muralist validate`'s checks (ValidationProblem lists every problem; nothing is
        sent then). ConfigMaps in the same file are created (or replaced) first. The job goes to
        the namespace its manifest names, else the client's; a manifest naming another namespace
        than the one the client was given is refused (ValueError), as kubectl refuses it."""
        sub = submission(job)
        namespace = sub.in_namespace(self.namespace)
        if self._namespace_chosen and namespace != self.namespace:
            raise ValueError(f"{sub.name}: the manifest's namespace {namespace} is not the client's {self.namespace}")
        for companion in sub.companions:
            self._put_config_map(namespace, companion)
        created = self._custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, sub.body)
        return DiffusionJob.model_validate(created)

    def get(self, name: str) -> DiffusionJob:
        """The job, typed; raises the kubernetes ApiException (status 404) when there is none."""
        return DiffusionJob.model_validate(self._get_object(name))

    def list(self) -> list[DiffusionJob]:
        """Every DiffusionJob of the namespace."""
        listed = self._custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        return [DiffusionJob.model_validate(item) for item in listed["items"]]

    def delete(self, name: str) -> None:
        """Delete the job; its pods, Job and Service go with it (garbage collection). The output stays."""
        self._custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                     propagation_policy="Background")

    def status(self, name: str) -> DiffusionJobStatus:
        """The job's status as it is now (read alone, so a job whose spec these models refuse still reads)."""
        return following.status_of(self._get_object(name))

    # --- following -------------------------------------------------------------------------

    def follow(self, name: str, timeout: float | None = None) -> Iterator[DiffusionJobStatus]:
        """The job's status each time it changes, until it is Succeeded or Failed (a watch,
        resumed from its resourceVersion); raises WaitTimeout after `timeout` seconds, JobDeleted."""
        return following.follow(self._custom, self.namespace, name, timeout)

    def wait(self, name: str, progress: bool = True, timeout: float | None = None) -> DiffusionJobStatus:
        """Follow the job to its end, drawing a progress bar (images done of the total, the
        operator's rate and ETA) on stderr when `progress`; returns the final status.

        Raises JobFailed (with the message and the failed indexes) when it fails, WaitTimeout
        (a TimeoutError, with the last status seen) after `timeout` seconds.
        """
        bar = ProgressBar(name) if progress else None
        try:
            status = DiffusionJobStatus()
            for status in self.follow(name, timeout):
                if bar is not None:
                    bar.show(status)
        finally:
            if bar is not None:
                bar.close()
        if status.phase == Phase.FAILED:
            raise JobFailed(name, status)
        return status

    # --- what it made ----------------------------------------------------------------------

    def output_folder(self, name: str, root: str | os.PathLike[str] | None = None) -> Path | str:
        """Where the job's outputs are: its URI when it writes to object storage (spec.output.uri),
        else on this machine: `root` is where the job's output volume is mounted here (a hostPath
        volume is found without it)."""
        return outputs.output_folder(self.get(name), root)

    def results(self, name: str, root: str | os.PathLike[str] | None = None, as_pandas: bool = False,
                storage_options: dict[str, Any] | None = None) -> Any:
        """The job's index (a Parquet table: one row per item with its key, prompt, seed, shard,
        status, seconds and error) as a pyarrow Table, or a pandas DataFrame when `as_pandas`.

        Read from the job's output folder (see `output_folder`): a volume mounted here at `root`, or
        object storage, with this machine's credentials and `storage_options` (fsspec's; default the
        job's spec.output.endpoint).
        """
        job = self.get(name)
        folder = outputs.output_folder(job, root)
        return outputs.read_index(folder, as_pandas=as_pandas, storage_options=_options(job, storage_options))

    def open_image(self, name: str, key: str, root: str | os.PathLike[str] | None = None,
                   storage_options: dict[str, Any] | None = None) -> Any:
        """Item `key` (the index's `key` column, e.g. 00003-001) of the job as a PIL Image."""
        job = self.get(name)
        return outputs.open_image(outputs.output_folder(job, root), key, _options(job, storage_options))

    # --- plumbing --------------------------------------------------------------------------

    def _get_object(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return obj

    def _put_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.create_namespaced_config_map(namespace, body)
        except ApiException as e:
            if e.status != HTTP_CONFLICT:
                raise
            self._core.replace_namespaced_config_map(body["metadata"]["name"], namespace, body)

