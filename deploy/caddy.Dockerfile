# syntax=docker/dockerfile:1
#
# Caddy with this module, built by xcaddy from the build context (the
# repository root), at the Caddy version the module's go.mod requires.
#
#   docker build -f deploy/caddy.Dockerfile -t browser-grid-caddy .
#
# The image carries no Caddyfile: mount one at /etc/caddy/Caddyfile
# (deploy/compose.Caddyfile, or the ConfigMap in deploy/k8s/).

ARG GO_VERSION=1.26
ARG DEBIAN_RELEASE=trixie

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# xcaddy is a tool of the module (go.mod: tool .../xcaddy), so its version
# is the one go.sum pins.
RUN CGO_ENABLED=0 XCADDY_SKIP_CLEANUP=0 \
	go tool xcaddy build v2.11.9 --output /out/caddy \
		--with github.com/browsergrid/caddy-browser-grid=.

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
	&& DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
	&& rm -rf /var/lib/apt/lists/* \
	&& groupadd --system --gid 10002 caddy \
	&& useradd --system --uid 10002 --gid caddy --create-home --home-dir /var/lib/caddy caddy
COPY --from=build /out/caddy /usr/bin/caddy
ENV XDG_CONFIG_HOME=/var/lib/caddy/config \
	XDG_DATA_HOME=/var/lib/caddy/data
# 8080: the grid's WebSocket route; 9180: Prometheus metrics.
EXPOSE 8080 9180
USER 10002:10002
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/caddy"]
CMD ["run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]
