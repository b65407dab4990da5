"""The work of a pod's run: the job's rows (sources/, rows) and their items' input images as bytes (inputs),
cut into chunks that groups claim from a shared counter (chunks, claims) kept by the claim store of this world
(store), the rules by which failed items fail the job (item_failures), and the ranks' compile records that
reach the merge through that store (compile_records)."""
