"""What a pod tells others while and after it runs: its ranks' files (rank_files), each rank's
counts and JSON lines (progress), each rank's peak memory (peak_memory), the pod's reports pushed to
the operator (push), and the termination message Kubernetes keeps (termination)."""
