"""The inventory file -> model/: the loader, the host sources, the setup: and sync: blocks,
and the inventory `orchestrate local` builds."""
