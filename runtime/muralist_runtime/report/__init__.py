"""What a pod tells others while and after it runs: its ranks' files (rank_files), each rank's
counts and JSON lines (progress), the pod's reports pushed to the operator (push), and the
termination message Kubernetes keeps (termination)."""
