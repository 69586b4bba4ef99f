"""Learning: training students, evaluating them, automatic-expert DAgger rounds and their executors (local, Ray)."""
