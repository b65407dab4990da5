"""The claim/render loop of a pod's run: claim chunks until none is left; render and write their items
(claim_loop), whose failure an exception is (failures), the step cache's quality gate (cache_gate)."""
