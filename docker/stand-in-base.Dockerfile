# A stand-in for the official python:3.11-slim image, for machines that reach no image registry
# (CI here). docker/cluster.sh up --stand-in-base builds it on a Debian bookworm root file system
# made by debootstrap from the machine's apt mirror, and tags it with the name docker/Dockerfile's
# FROM expects, so that what the tests build is docker/Dockerfile itself.
#
# What docker/Dockerfile relies on, as in the official image: Debian bookworm with apt,
# ca-certificates (update-ca-certificates), Python 3.11 with pip at /usr/local/bin, and
# /usr/local/bin first on PATH. Here /usr/local is a venv over Debian's python3, so pip installs
# into /usr/local/lib/python3.11/site-packages as it does in the official image.
FROM orchestrate-stand-in-rootfs:bookworm

ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local \
    && /usr/local/bin/python --version

CMD ["python3"]
