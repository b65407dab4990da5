"""The claim/render loop of a pod's run: claim chunks until none is left; render and write their items."""
