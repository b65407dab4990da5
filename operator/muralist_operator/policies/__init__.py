"""One policy per module, each a few pure functions with its own table tests
(tests/unit/operator/test_policies.py): time to live, deadline, suspension, failures and restarts,
stall detection, pods that never start, worlds that span pods. `lifecycle.decide` applies them in order."""
