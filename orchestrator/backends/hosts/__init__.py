"""The hosts backend: workers on machines reached locally or over SSH, with the checks, setup,
sync and firewall rules that only such machines have."""
