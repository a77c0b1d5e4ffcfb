"""Nightly build jobs: a recipe matrix compiled, evaluated and benchmarked on a schedule, with a build cache, a
history, regression rules and a report. It sits above the compiler and depends only downward on it.

`config` (the NIGHTLY.yaml schema) -> `inputs` (what a bundle depends on) -> `cache` (bundles by that hash) ->
`measure` (eval suites, interleaved benchmark) -> `rules` (against the last good night in `history`) -> `report`.
`night` runs the steps; `command` is the CLI's entry.
"""
