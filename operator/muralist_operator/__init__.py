"""Muralist's Kubernetes operator: DiffusionJob -> headless Service, spec ConfigMap, Indexed Job and,
unless the job or the operator's setting turns it off, a NetworkPolicy.

Its modules, top down (import-linter checks these layers):

- `main`: `muralist operator`, the wiring handed to kopf in its memo, kopf's settings and the
  threads beside its watches (startup and cleanup handlers);
- `handlers`: kopf's indexes of the children and the triggers that reconcile a job; `clock`: the
  thread that reconciles each job when something about it moves with time alone;
- `reconciler`: observe, decide, write status once, act, say when to look again;
- `observer`: what a reconcile observes (the indexes, the pushed progress, Warning events);
  `children`: a job's children rendered, created once, created again when gone;
- `lifecycle`: what a reconcile decides (pure), applying `policies/` in order; `skew`: what a
  newer CRD or operator wrote; `peering`: which replica reconciles (kopf's rule); `metrics`;
  `manifests`: `muralist validate` and `render`; `crd`: the CRD from the API types, with
  `crd_baseline` (the skew baseline's fields);
- `kube`: the API calls, each with a timeout and bounded retries (with `handlers`, `main` and the
  progress endpoint's `auth` and `tls`, the only modules that import kubernetes or kopf);
- `planning`: `strategy: Auto` planned once from the nodes' GPU labels (or the pods' resources) and
  kept in status (pure);
- `render`: a DiffusionJob -> its child objects (pure); `pod`: the pods' template;
- `observe`: summaries of the children, the vocabulary of deciding from them;
- `progress/`: the endpoint the pods post progress to, and the totals from the posts;
- `naming` (names, labels), `settings` (how the operator was deployed), `decision` (transitions,
  actions, events), `schedule` (the clock's priority queue), `indexes` (kopf's indexes by name),
  `grace` (how long a pod told to stop may take).
"""
