"""The claim/render loop of a pod's run: claim chunks until none is left; render and write their items
(claim_loop), in batches of one size and one batch size (batching), a size compiled at its first call and the
compile records told to the merge (compiled), and whose failure an exception is (failures). The step cache's
quality gate it runs is the step cache's (the step_cache package's gate)."""
