"""One policy per module, each a few pure functions with its own table tests
(tests/unit/operator/test_policies.py); `lifecycle.decide` applies them in this order:

- `ttl`: a finished job's time to live;
- `deadline`: runPolicy.activeDeadlineSeconds;
- `resize`: nodes changed while the job runs;
- `suspension`: runPolicy.suspend;
- `failure`: failures and restarts, per index;
- `start`: pods that never start;
- `world`: worlds that span pods restart together;
- `stall`: a pod that stopped making progress (and, earlier, whether the job's posts still arrive);
- `cost`: GPU-seconds so far and per item, and at a price per GPU-hour the cost so far and to finish.

Each stands alone (import-linter checks it): what two share is a view of the children
(muralist_operator.observe) or the vocabulary of a decision (muralist_operator.decision)."""
