"""The world of a pod's run: who this process is (job rank, group, pod) and its process group
(distributed), whether the pod was told to stop (drain: its drain file, read where stopping costs
least), and how its ranks start: forked from a warm interpreter that did their imports (zygote)."""
