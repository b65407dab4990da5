"""How this operator was deployed: what every job's objects inherit unless the job says otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from muralist_api.contract import CLAIMS_PORT, MASTER_PORT

# Where the pods post progress unless the operator is told otherwise: the chart's progress
# Service in the chart's default namespace.
DEFAULT_PROGRESS_URL = "https://muralist-progress.muralist-system.svc:8443"


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = "ghcr.io/muralist/runtime:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    shm_size: str = "8Gi"
    master_port: int = MASTER_PORT
    claims_port: int = CLAIMS_PORT
    # The operator's progress endpoint (contract.progress_url adds the job's path); None: the
    # pods get no progress endpoint and status counts come from their termination messages.
    progress_url: str | None = DEFAULT_PROGRESS_URL
    # The PEM of the CA that signed the endpoint's certificate, handed to the pods in their spec
    # ConfigMap; None: the pods trust their image's CA bundle (a publicly issued certificate).
    progress_ca: str | None = None
    # A NetworkPolicy per job (render_network_policy) unless the job says otherwise.
    network_policies: bool = True
    # What a GPU-hour costs, for status.cost (a job's muralist.dev/price-per-gpu-hour annotation overrides it).
    price_per_gpu_hour: float | None = None

    def ships_progress_ca(self) -> bool:
        """Whether the pods get the progress endpoint's CA with their spec (a private CA)."""
        return self.progress_url is not None and bool(self.progress_ca)

    def ports(self) -> list[tuple[str, int]]:
        """The rendezvous of a world that spans pods, and the work-claim store the first pod hosts."""
        return [("rendezvous", self.master_port), ("claims", self.claims_port)]
