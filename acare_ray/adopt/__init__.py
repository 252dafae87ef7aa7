"""``acare adopt``: a team's own traces to a go/no-go decision (docs/training.md)."""
