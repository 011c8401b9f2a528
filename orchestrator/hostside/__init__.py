"""What orchestrate runs on a worker host, a Slurm node or a pod: stdlib-only programs shipped as
text (hostside/bundle.py), importing only each other and orchestrator.contract."""
