"""The plan of a pod's run, made before the world exists: the work's rows and chunks (work), the
model resolved and its parallel layout checked (model), its memory estimated and an Auto plan confirmed
by what this rank measures (confirm); and strategy Auto planned for one machine, for `muralist run` and
`muralist plan` (auto).

First and before the world: the world's groups are the model plan's group size, and a spec that
cannot run (no rows, a layout the model cannot take, a plan the devices contradict) is a permanent
failure found by every rank at once, in seconds, before any of them waits for the others or loads
weights."""
