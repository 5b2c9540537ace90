# syntax=docker/dockerfile:1
#
# One browser worker: grid-worker (PID 1) fronting Debian's Chromium,
# launched through playwright-core's launchServer
# (playwright/launch-server.mjs) on loopback; proxies dial the agent.
# Build from the repository root:
#
#   docker build -f deploy/worker.Dockerfile -t browser-grid-worker .
#
# SIGTERM (docker stop, a pod's termination) reaches grid-worker itself,
# which drains the browser, waits up to DRAIN_TIMEOUT for its sessions,
# deregisters and stops it: give the container more than DRAIN_TIMEOUT +
# 10s to stop (compose stop_grace_period, Kubernetes
# terminationGracePeriodSeconds).

ARG GO_VERSION=1.26
ARG DEBIAN_RELEASE=trixie

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS agent
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/grid-worker ./cmd/grid-worker

# playwright-core from the lockfile, installed where npm is, so that the
# final image carries node but not npm.
FROM debian:${DEBIAN_RELEASE}-slim AS playwright
RUN apt-get update \
	&& DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm ca-certificates \
	&& rm -rf /var/lib/apt/lists/*
WORKDIR /opt/grid/playwright
COPY playwright/package.json playwright/package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --loglevel=error
COPY playwright/ ./

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
	&& DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
		chromium chromium-headless-shell ffmpeg nodejs ca-certificates fonts-liberation \
	&& rm -rf /var/lib/apt/lists/* \
	&& groupadd --system --gid 10001 grid \
	&& useradd --system --uid 10001 --gid grid --create-home --home-dir /home/grid grid
COPY --from=agent /out/grid-worker /opt/grid/bin/grid-worker
COPY --from=playwright /opt/grid/playwright /opt/grid/playwright

# Every name below is a grid-worker environment variable (grid-worker -help).
ENV GRID_WORKER_HOST=0.0.0.0 \
	GRID_WORKER_PORT=3131 \
	BROWSER_EXECUTABLE=/usr/bin/chromium \
	PLAYWRIGHT_LAUNCH_SCRIPT=/opt/grid/playwright/launch-server.mjs \
	LOG_FORMAT=json
EXPOSE 3131

# A numeric user, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /home/grid
STOPSIGNAL SIGTERM
# Exec form: no shell in between, so the signal reaches grid-worker.
ENTRYPOINT ["/opt/grid/bin/grid-worker"]
