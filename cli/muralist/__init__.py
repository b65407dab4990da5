"""`muralist`: a Python client for DiffusionJobs on a cluster, the one `muralist submit` and `status` use.

    from muralist import Client
    client = Client()                      # the kubeconfig's context, or in-cluster config
    client.create("examples/quickstart-cpu.yaml")
    status = client.wait("quickstart")     # a progress bar; raises JobFailed on Failed
    table = client.results("quickstart", root="/mnt/outputs")

It may import `muralist_api` and the kubernetes client, never the runtime or the operator
(import-linter checks it), so it installs beside neither image's dependencies. Modules:

- `client`: `Client` (create, get, list, delete, status, follow, wait, results, open_image) and
  `connect` (kubeconfig or in-cluster configuration);
- `job_input`: what `create` accepts, checked by `muralist validate`'s rules before it is sent;
- `follow`: a job's status as it changes, by a watch resumed from its resourceVersion;
- `errors`: `JobFailed`, `WaitTimeout` (a TimeoutError), `JobDeleted`;
- `status_text`: a status for people (`muralist status`, the bar's counts and suffix);
- `progress_bar`: the tqdm bar `wait` draws;
- `results`: a job's output folder read: the index as a table, an item's image.
"""

from muralist.client import Client, connect
from muralist.errors import JobDeleted, JobFailed, WaitTimeout
from muralist.results import item_bytes, open_image, read_index
from muralist.status_text import describe

__all__ = ["Client", "JobDeleted", "JobFailed", "WaitTimeout", "connect", "describe", "item_bytes", "open_image",
           "read_index"]
