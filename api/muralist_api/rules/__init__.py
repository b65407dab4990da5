"""The rules catalog and parsing a manifest.

- `catalog`: the facts both admission and the runtime check (model layouts, attention backends,
  degrees, limits), each check a rule that returns (field, message) problems;
- `workloads`: inputs, videos, schedulers and the pipeline call's extra arguments against what the
  pipelines take;
- `sequence`: context-parallel sequence lengths (the runtime checks them on the machine);
- `problems`: `parse_job`, a manifest into a DiffusionJob or `ValidationProblem`, every problem
  named by its field.

The catalog, workloads and sequence sit below the API types (which declare the CEL rules that
mirror them); problems sits above them (it builds a DiffusionJob).
"""
