"""SGLang's plan: `settings` (its flags as the release resolves them), `memory` (its GPU-memory arithmetic per
release), `rules` (its startup checks in its own words) and `planner` (its `Planner`)."""
