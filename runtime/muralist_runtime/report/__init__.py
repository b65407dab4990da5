"""What a pod tells others while and after it runs: progress (rank files, pushed reports, the bar) and the
termination message Kubernetes keeps."""
