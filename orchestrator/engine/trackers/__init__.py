"""The run in the experiment trackers (job.tracking, docs/tracking.md): the one MLflow run and
W&B id that an orchestrate run keeps whatever its restarts, and which earlier tracking run an
`up` resumes. It reads the run store and nothing above it; observe/notify hands it the run's
events, start/ opens it."""
