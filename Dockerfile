# clipshard (and its old command names, aliases) in a container, for the Kubernetes Jobs of
# docs/scaling/ (convert-job.yaml, merge-job.yaml):
#   docker build -t REGISTRY/clipshard:TAG . && docker push REGISTRY/clipshard:TAG
# Stage 1 builds static binaries (no cgo: nothing to link at run time);
# stage 2 is busybox, for the POSIX sh that the Jobs' scripts need, and
# runs as an unprivileged user (65532). The test of the Jobs
# (cmd/convert/scaling_test.go) builds with this file's go build line.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/ ./cmd/clipshard ./cmd/convert ./cmd/shuffle ./cmd/verify

FROM busybox:1.37
COPY --from=build /out/ /clipshard/bin/
USER 65532:65532
WORKDIR /tmp
CMD ["/clipshard/bin/clipshard", "help"]
