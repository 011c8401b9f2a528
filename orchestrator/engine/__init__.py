"""What orchestrate does with a cluster, written once against backends.base.Backend: plan and
start attempts, watch and classify workers, restart, stop, keep the run records."""
