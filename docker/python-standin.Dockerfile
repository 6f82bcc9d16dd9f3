# A local stand-in for the official python:3.11-slim image, for machines that reach no container
# registry (docker/smoke.sh builds it and tags it python:3.11-slim only when no such image is
# present). Its base is a Debian bookworm root made with `debootstrap --variant=minbase` from
# the mirror the host's apt uses and imported with `docker import`.
#
# Like the official image: Debian bookworm, Python 3.11 with venv and pip, `python` and `pip`
# on PATH, pip free to install into the system (no EXTERNALLY-MANAGED marker). Unlike it: the
# host's own network set-up is baked in, so builds on top of it reach what the host reaches:
# the host's extra CA certificates (ca/, for HTTPS through an intercepting proxy), its apt
# sources and settings (apt/), and its network package indexes (pip.conf; indexes and
# find-links on the host's local disk are left out, the image's builds do not need them).

FROM talkies-smoke/debian:bookworm

COPY apt/ /etc/apt/
COPY ca/ /usr/local/share/ca-certificates/
# Versions come from the mirror's snapshot, as in the image this stands in for.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && update-ca-certificates \
    && rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && ln -s /usr/bin/python3 /usr/local/bin/python \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip
COPY pip.conf /etc/pip.conf

ENV LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.talkies.stand-in-for="python:3.11-slim"
CMD ["python3"]
