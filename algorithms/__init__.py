"""The science, pure: budgets and plans, segmentation, layouts, streaming schedules, pruning, FLOPs, scoring rules
(torch / numpy and the standard library only; no lightning, no transformers, no I/O)."""
