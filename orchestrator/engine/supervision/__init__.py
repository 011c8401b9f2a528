"""Keeping a run going: the supervisor's loop (poll, detect, stop, recover, mirror checkpoints,
standbys), its pure failure policy, re-planning around dead hosts, stacks at a stall, the lease
watch and the hosts' roles acted on; the locks that allow one supervisor per run and one `up`
per state directory; and how other processes reach a live supervisor (`down`'s stop,
`attach`'s watch: contact). It judges through observe/ and acts through workers/; it never
starts a run (start/ does, and hands the run to it)."""
