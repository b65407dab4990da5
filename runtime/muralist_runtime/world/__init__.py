"""The world of a pod's run: who this process is (job rank, group, pod) and its process group."""
