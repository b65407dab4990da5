"""The world of a pod's run: who this process is (job rank, group, pod) and its process group
(distributed), and whether the pod was told to stop (drain: its drain file, read where stopping costs
least)."""
